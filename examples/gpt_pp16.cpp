// SPDX-License-Identifier: Apache-2.0
// The gpt example's pipeline recipes with 16-bit parameters (bf16, f16).
#define GPT_DRIVER_16_BIT
#include "gpt_pp.cpp"
