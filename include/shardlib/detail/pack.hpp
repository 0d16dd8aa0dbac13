// SPDX-License-Identifier: Apache-2.0
/// @file
/// `Pack<Ts...>`: a tuple that GPU kernels can carry and read. `std::tuple`'s `std::get` is
/// constexpr host code, which nvcc refuses in device code without `--expt-relaxed-constexpr`;
/// `get<I>(pack)` here is a `KOKKOS_FORCEINLINE_FUNCTION`. Used by the loops over tensors
/// (tensor.hpp: the other tensors' block pointers) and the elementwise kernels (their inputs).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstddef>

namespace shardlib::detail {

/// Values of types Ts, head first.
template <class... Ts>
struct Pack;
template <>
struct Pack<> {};
template <class H, class... Ts>
struct Pack<H, Ts...> {
  H head;
  Pack<Ts...> rest;
};

/// A Pack of `v...` (of the explicit types Ts, when given: `pack<const float*>(p)`).
template <class... Ts>
Pack<Ts...> pack(Ts... v) {
  if constexpr (sizeof...(Ts) == 0) {
    return {};
  } else {
    // A generic lambda splits the head off: an overload for the empty pack could not take the
    // explicit empty argument list (`pack<>()`) that a loop over one tensor produces.
    return [](auto h, auto... r) { return Pack<Ts...>{h, pack(r...)}; }(v...);
  }
}

/// Element I of a Pack, on the host or a GPU.
template <std::size_t I, class H, class... Ts>
KOKKOS_FORCEINLINE_FUNCTION const auto& get(const Pack<H, Ts...>& p) {
  if constexpr (I == 0) return p.head;
  else return get<I - 1>(p.rest);
}

}  // namespace shardlib::detail
