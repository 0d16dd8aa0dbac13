// SPDX-License-Identifier: Apache-2.0
/// @file
/// A thin layer over HDF5's C API for the checkpoint code: owned handles, HDF5's error stack
/// turned into exceptions (HDF5 prints nothing to stderr), and the few attribute and type
/// helpers the format needs.
///
/// HDF5 as Debian builds it (serial, 1.10) is not thread-safe: every call into it holds
/// `hdf5_lock()`. The checkpoint code calls HDF5 from one device of a run only (metadata);
/// the devices move the data themselves (io/file.hpp).
#pragma once
#include <shardlib/collectives/types.hpp>

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardlib::io {

/// A checkpoint could not be written or read: what, which file, which tensor and block.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace h5 {

/// Held around every HDF5 call (HDF5 is not thread-safe as built here).
inline std::unique_lock<std::recursive_mutex> hdf5_lock() {
  static std::recursive_mutex m;
  return std::unique_lock<std::recursive_mutex>(m);
}

/// HDF5's innermost error message for the failed call (its own stack is not printed).
inline std::string last_error() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* e, void* data) -> herr_t {
        auto& s = *static_cast<std::string*>(data);
        if (n == 0 && e->desc) s = e->desc;
        return 0;
      },
      &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? std::string("unknown HDF5 error") : out;
}

/// Turns HDF5's automatic error printing off for this process, and its clean-up at exit (once,
/// before any other HDF5 call of ours). HDF5 1.10 keeps the identifier of a file whose H5Fclose
/// failed (a write error while flushing) after freeing the file, and its exit handler then
/// crashes on it; every file we open is closed by us, so the exit handler has nothing to do.
inline void quiet() {
  static const bool done = [] {
    H5dont_atexit();
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

/// An owned HDF5 identifier, closed with the function that matches its kind.
class Handle {
 public:
  Handle() = default;
  Handle(hid_t id, herr_t (*close)(hid_t)) noexcept : id_(id), close_(close) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  hid_t get() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ >= 0; }
  /// Closes now; returns whether HDF5 reported success (a file's close writes its metadata).
  bool close() noexcept {
    if (id_ < 0) return true;
    const herr_t r = close_(std::exchange(id_, H5I_INVALID_HID));
    return r >= 0;
  }

 private:
  void reset() noexcept { (void)close(); }
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

/// `id` as a Handle closed by `close`; throws Error("<what>: <HDF5's message>") when the call
/// that made it failed (id < 0).
inline Handle check(hid_t id, herr_t (*close)(hid_t), const std::string& what) {
  if (id < 0) throw Error(what + ": " + last_error());
  return Handle(id, close);
}
inline void check(herr_t r, const std::string& what) {
  if (r < 0) throw Error(what + ": " + last_error());
}

/// The HDF5 type that stores `t` in a file (little-endian; f16 and bf16 as 16-bit unsigned
/// words, their kind named by an attribute).
inline hid_t file_type(coll::DType t) {
  using coll::DType;
  switch (t) {
    case DType::i8: return H5T_STD_I8LE;
    case DType::u8: return H5T_STD_U8LE;
    case DType::i16: return H5T_STD_I16LE;
    case DType::u16: case DType::f16: case DType::bf16: return H5T_STD_U16LE;
    case DType::i32: return H5T_STD_I32LE;
    case DType::u32: return H5T_STD_U32LE;
    case DType::i64: return H5T_STD_I64LE;
    case DType::u64: return H5T_STD_U64LE;
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
  }
  return H5T_STD_U8LE;
}

/// The DType of a dataset's stored type, when it is one of file_type's (ignoring f16/bf16,
/// which the dtype attribute names); false for any other type.
inline bool dtype_of_file_type(hid_t type, coll::DType& out) {
  using coll::DType;
  for (DType t : {DType::i8, DType::u8, DType::i16, DType::u16, DType::i32, DType::u32, DType::i64, DType::u64,
                  DType::f32, DType::f64})
    if (H5Tequal(type, file_type(t)) > 0) {
      out = t;
      return true;
    }
  return false;
}

/// Writes a string attribute, fixed-length UTF-8 (h5py reads it as bytes). Fixed-length strings
/// live in the object's header, which HDF5 checksums; variable-length ones live in the global
/// heap, which it does not (a corrupted heap crashed HDF5 1.10 in our fault tests).
inline void write_attr(hid_t obj, const char* name, const std::string& value) {
  Handle type = check(H5Tcopy(H5T_C_S1), H5Tclose, "H5Tcopy");
  check(H5Tset_size(type.get(), value.size() + 1), "H5Tset_size");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  Handle space = check(H5Screate(H5S_SCALAR), H5Sclose, "H5Screate");
  Handle attr = check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                      std::string("creating attribute ") + name);
  check(H5Awrite(attr.get(), type.get(), value.c_str()), std::string("writing attribute ") + name);
}

/// Writes a 1-D integer attribute (an empty one has a null dataspace).
template <class I>
void write_attr(hid_t obj, const char* name, const std::vector<I>& values) {
  static_assert(sizeof(I) == 8, "64-bit attributes only");
  const hid_t file = std::is_signed_v<I> ? H5T_STD_I64LE : H5T_STD_U64LE;
  const hid_t mem = std::is_signed_v<I> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64;
  const hsize_t n = values.size();
  Handle space = check(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL), H5Sclose, "H5Screate");
  Handle attr = check(H5Acreate2(obj, name, file, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                      std::string("creating attribute ") + name);
  if (n) check(H5Awrite(attr.get(), mem, values.data()), std::string("writing attribute ") + name);
}

/// Whether `obj` has attribute `name`.
inline bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

/// Reads a fixed-length string attribute. Throws Error naming it when it is missing or not one.
inline std::string read_string_attr(hid_t obj, const char* name) {
  Handle attr = check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, std::string("opening attribute ") + name);
  Handle type = check(H5Aget_type(attr.get()), H5Tclose, std::string("attribute ") + name);
  if (H5Tget_class(type.get()) != H5T_STRING) throw Error(std::string("attribute ") + name + " is not a string");
  Handle space = check(H5Aget_space(attr.get()), H5Sclose, std::string("attribute ") + name);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) throw Error(std::string("attribute ") + name + " is not one string");
  if (H5Tis_variable_str(type.get()) > 0) throw Error(std::string("attribute ") + name + " is not a fixed-length string");
  const std::size_t n = H5Tget_size(type.get());
  std::string s(n, '\0');
  check(H5Aread(attr.get(), type.get(), s.data()), std::string("reading attribute ") + name);
  s.resize(s.find('\0') == std::string::npos ? n : s.find('\0'));
  return s;
}

/// Reads a 1-D 64-bit integer attribute (empty for a null dataspace).
template <class I>
std::vector<I> read_int_attr(hid_t obj, const char* name) {
  static_assert(sizeof(I) == 8, "64-bit attributes only");
  Handle attr = check(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose, std::string("opening attribute ") + name);
  Handle type = check(H5Aget_type(attr.get()), H5Tclose, std::string("attribute ") + name);
  if (H5Tget_class(type.get()) != H5T_INTEGER) throw Error(std::string("attribute ") + name + " is not an integer array");
  Handle space = check(H5Aget_space(attr.get()), H5Sclose, std::string("attribute ") + name);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0) throw Error(std::string("attribute ") + name + ": " + last_error());
  std::vector<I> v(static_cast<std::size_t>(n));
  if (n) check(H5Aread(attr.get(), std::is_signed_v<I> ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64, v.data()),
               std::string("reading attribute ") + name);
  return v;
}

}  // namespace h5
}  // namespace shardlib::io
