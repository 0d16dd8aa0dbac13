// SPDX-License-Identifier: Apache-2.0
/// @file
/// `FunctionRef<R(Args...)>`: a non-owning reference to a callable (as C++26's std::function_ref).
///
/// The library's runtime-generic code (running a reshard, packing blocks) takes callbacks
/// through it instead of a template parameter, so that it is compiled once per element type
/// rather than once per calling lambda: every spec type's lambda would otherwise instantiate its
/// own copy. The referenced callable must outlive the call (pass it as an argument, never store
/// it).
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace shardlib::detail {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): binds like a function parameter
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace shardlib::detail
