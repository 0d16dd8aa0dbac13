// SPDX-License-Identifier: Apache-2.0
/// @file
/// Pipeline parallelism (docs/11_pipeline_parallel.md): schedules as data (GPipe, 1F1B,
/// interleaved 1F1B) and their runner over a mesh's stage axis. Not included by
/// <shardlib/shardlib.hpp>: it needs autodiff.
#pragma once

#include <shardlib/autodiff.hpp>
#include <shardlib/pipeline/runner.hpp>
#include <shardlib/pipeline/schedule.hpp>
