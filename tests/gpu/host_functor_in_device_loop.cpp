// SPDX-License-Identifier: Apache-2.0
// A host-only functor in a loop over a tensor in GPU memory does not compile: compiled with
// nvcc_wrapper against a CUDA-enabled Kokkos with -DCASE=1..5, each case must fail with nvcc's
// "calling a __host__ function ... from a __host__ __device__ function" naming shardlib's kernel
// (ForKernel<1, ...>, MapKernel<1, ...>, ReduceKernel, FlatKernel<1, ...>, DeviceStencil); with
// -DCASE=0 the same functors on tensors in host memory must compile. Not built by meson (CI's Kokkos has no
// CUDA): docs/13_gpus.md, "What has run where", has the commands.
#include <shardlib/shardlib.hpp>
#include <shardlib/stencil.hpp>

namespace sl = shardlib;
using M = sl::Mesh<"x">;
using Gpu = sl::DistributedTensor<float, M, sl::Spec<"x">, Kokkos::CudaSpace>;
using Host = sl::DistributedTensor<float, M, sl::Spec<"x">, Kokkos::HostSpace>;

// Functors whose operator() is host-only (no KOKKOS_INLINE_FUNCTION).
struct HostMap {
  float operator()(float v) const { return v + 1; }
};
struct HostFor {
  void operator()(const sl::Index<1>&, float& v) const { v += 1; }
};
struct HostReduce {
  double operator()(const sl::Index<1>&, float v) const { return v; }
};
struct HostZip {
  float operator()(float a, float b) const { return a * b; }
};
struct HostStencil {
  template <class Nb>
  float operator()(const sl::Index<1>&, const Nb& nb) const { return nb(-1) + nb(1); }
};

#if CASE == 1
void use(Gpu& t) { sl::parallel_for(t, HostFor{}); }
#elif CASE == 2
Gpu use(const Gpu& t) { return sl::map(t, HostMap{}); }
#elif CASE == 3
double use(const Gpu& t) { return sl::parallel_reduce(t, HostReduce{}); }
#elif CASE == 4
Gpu use(const Gpu& t) { return sl::zip(HostZip{}, t, t); }
#elif CASE == 5
void use(Gpu& t, Gpu& out) {
  auto g = sl::ghosted(t, {1});
  sl::stencil_for(out, g, HostStencil{});
}
#else
double use(Host& t) {
  sl::parallel_for(t, HostFor{});
  const Host m = sl::map(t, HostMap{});
  Host z = sl::zip(HostZip{}, t, m);
  auto g = sl::ghosted(t, {1});
  sl::stencil_for(z, g, HostStencil{});
  return sl::parallel_reduce(z, HostReduce{});
}
#endif
