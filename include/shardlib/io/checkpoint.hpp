// SPDX-License-Identifier: Apache-2.0
/// @file
/// Distributed checkpoints: save tensors on one mesh, load them onto any mesh and spec.
///
/// ```
/// sl::io::save("run/step100.h5", {{"w1", w1}, {"layer0/b", b}});       // collective
/// sl::io::load("run/step100.h5", {{"w1", w1_other_spec}, {"layer0/b", b}});  // any mesh, spec
/// auto w = sl::io::load<W>(mesh, "run/step100.h5", "w1");               // shape from the file
/// auto host = sl::io::read<float>("run/step100.h5", "w1");              // no runtime needed
/// ```
///
/// The file is HDF5: one dataset per tensor in its global shape and element type (h5py shows
/// ordinary arrays), attributes naming the mesh, the spec, the library and format versions,
/// and a checksum per saved block (io/checksum.hpp).
///
/// Save: one device creates the file's metadata (HDF5, serial), then every device writes the
/// blocks it is the primary holder of straight into the datasets (replicas write nothing):
/// one POSIX writer per device under the threads backend, one MPI-IO collective write per
/// tensor under mpi; each block's checksum is summed while it is written. The file is written
/// under a temporary name in the same directory and renamed over `path` once every device has
/// finished (and the data is on disk): a checkpoint is complete or absent, and a failed save
/// leaves the previous one intact.
///
/// Load: each device that holds a block of the new spec first-hand reads exactly that box of
/// the dataset (no gather, no full read), its replicas get it by one broadcast, and one
/// all_reduce checks every saved block's checksum (the sum splits over the readers). Nothing
/// is assigned to the caller's tensors unless every tensor loaded and checked.
///
/// Each device lists the tensors it holds (io/holding.hpp): the same list everywhere, or, for
/// a pipeline whose stages hold different layers, each stage its own. A tensor held by some
/// devices only is written from and read into them (each of them reads its own block).
#pragma once
#include <shardlib/io/checksum.hpp>
#include <shardlib/io/file.hpp>
#include <shardlib/io/hdf5.hpp>
#include <shardlib/io/holding.hpp>
#include <shardlib/tensor.hpp>
#include <shardlib/version.hpp>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

namespace shardlib {
namespace error {
template <class Spec>
struct a_partial_tensor_cannot_be_saved_reshard_it_to_a_spec_without_partial_first;
}  // namespace error

namespace io {

/// The version of the checkpoint layout this code writes and reads.
inline constexpr std::int64_t format_version = 1;

/// What save() does beyond writing the file.
struct SaveOptions {
  /// fsync the file and its directory before save() returns (crash-safe on power loss too).
  bool durable = true;
};
/// What load() checks.
struct LoadOptions {
  /// Check every saved block's checksum (one all_reduce of a word per saved block).
  bool verify_checksums = true;
};

/// Bytes this device moved to and from checkpoint files (counted since the Context began).
struct Stats {
  std::uint64_t bytes_written = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t saves = 0;
  std::uint64_t loads = 0;
};
/// This device's Stats.
inline Stats& stats(Context& ctx) { return ctx.state<Stats>(); }

/// One tensor of a checkpoint, as list() describes it.
struct TensorInfo {
  std::string name;
  coll::DType dtype = coll::DType::f32;
  std::vector<std::int64_t> shape;
  std::string spec;  ///< the spec it was saved with, e.g. Spec<"data", none>
  std::string mesh;  ///< the mesh it was saved on, e.g. Mesh<data=4, model=2>
};

/// A tensor to save: a name (slashes make groups: "layer0/w") and a tensor. Made from
/// `{"name", tensor}` in save()'s list.
class Entry {
 public:
  template <class T, class M, class S, class Mem>
  Entry(std::string name, const DistributedTensor<T, M, S, Mem>& t)  // NOLINT(google-explicit-constructor)
      : name_(std::move(name)),
        dtype_(coll::dtype_of<T>()),
        shape_(t.shape().begin(), t.shape().end()),
        sharding_(DistributedTensor<T, M, S, Mem>::sharding),
        mesh_(t.mesh().shape()),
        box_(t.block()),
        data_(t.local().data()),
        spec_(S::value.to_string()),
        ctx_(&t.context()) {
    SHARDLIB_STATIC_REQUIRE((!S::value.is_partial()),
                            "shardlib::io::save: a partial tensor holds addends, not values; reshard it to a spec "
                            "without partial first",
                            error::a_partial_tensor_cannot_be_saved_reshard_it_to_a_spec_without_partial_first<S>);
  }

 private:
  friend inline void save(const std::string&, std::span<const Entry>, const SaveOptions&);
  std::string name_;
  coll::DType dtype_;
  std::vector<std::int64_t> shape_;
  Sharding sharding_;
  MeshShape mesh_;
  ShardBox box_;
  const void* data_;
  std::string spec_;
  Context* ctx_;
};

namespace detail {

/// A hook the fault tests use to fail or stop a save at a named point on a chosen device
/// ("metadata_written" on device 0; "write" on every device, before it writes its blocks;
/// "data_written" on device 0, before the rename). Empty in programs.
inline std::function<void(const char* where, int device)>& fault_hook() {
  static std::function<void(const char*, int)> hook;
  return hook;
}
inline void fault_point(const char* where, int device) {
  if (fault_hook()) fault_hook()(where, device);
}
/// Whether a save reserves its file's bytes before the devices write (fallocate; see save()).
/// The fault tests turn it off to meet a full disk in the devices' writes themselves.
inline bool& reserve_space() {
  static bool on = true;
  return on;
}

/// Runs `f` on every device; then every device learns whether any failed and, if one did,
/// runs `cleanup` and throws the first failing device's message (collective: the same outcome
/// everywhere, so no device waits for a failed one): as std::invalid_argument when that was
/// one (bad input), else as Error.
template <class F>
void agree(coll::Communicator& world, F&& f, const std::function<void()>& cleanup = {}) {
  std::string msg;
  std::int32_t mine = INT32_MAX;
  std::uint64_t bad_input = 0;
  try {
    f();
  } catch (const std::invalid_argument& e) {
    msg = e.what();
    mine = world.rank();
    bad_input = 1;
  } catch (const std::exception& e) {
    msg = e.what();
    mine = world.rank();
  }
  std::int32_t first = INT32_MAX;
  world.all_reduce(&mine, &first, 1, coll::DType::i32, coll::Op::min);
  if (first == INT32_MAX) return;
  std::uint64_t head[2] = {msg.size(), bad_input};
  world.broadcast(head, 2, coll::DType::u64, first);
  msg.resize(head[0]);
  world.broadcast(msg.data(), head[0], coll::DType::u8, first);
  if (cleanup) cleanup();
  if (head[1]) throw std::invalid_argument(msg);
  throw Error(msg);
}

/// A dataset as the file describes it.
struct Stored {
  TensorInfo info;
  std::uint64_t offset = 0;              // file byte of element 0 (unused when empty)
  std::vector<ShardBox> blocks;          // the saved blocks (non-empty ones), tiling the tensor
  std::vector<std::uint64_t> checksums;  // one per block

  void write(Writer& w) const {
    w.str(info.name);
    w.u64(static_cast<std::uint64_t>(info.dtype));
    w.u64(info.shape.size());
    for (auto e : info.shape) w.u64(static_cast<std::uint64_t>(e));
    w.str(info.spec);
    w.str(info.mesh);
    w.u64(offset);
    w.u64(blocks.size());
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      for (int d = 0; d < blocks[b].rank; ++d) {
        w.u64(static_cast<std::uint64_t>(blocks[b].offset[static_cast<std::size_t>(d)]));
        w.u64(static_cast<std::uint64_t>(blocks[b].extent[static_cast<std::size_t>(d)]));
      }
      w.u64(checksums[b]);
    }
  }
  static Stored read(Reader& r) {
    Stored s;
    s.info.name = r.str();
    s.info.dtype = static_cast<coll::DType>(r.u64());
    s.info.shape.resize(static_cast<std::size_t>(r.u64()));
    for (auto& e : s.info.shape) e = static_cast<std::int64_t>(r.u64());
    s.info.spec = r.str();
    s.info.mesh = r.str();
    s.offset = r.u64();
    s.blocks.resize(static_cast<std::size_t>(r.u64()));
    s.checksums.resize(s.blocks.size());
    for (std::size_t b = 0; b < s.blocks.size(); ++b) {
      s.blocks[b].rank = static_cast<int>(s.info.shape.size());
      for (int d = 0; d < s.blocks[b].rank; ++d) {
        s.blocks[b].offset[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(r.u64());
        s.blocks[b].extent[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(r.u64());
      }
      s.checksums[b] = r.u64();
    }
    return s;
  }
  std::int64_t num_elements() const {
    std::int64_t n = 1;
    for (auto e : info.shape) n *= e;
    return n;
  }
  std::string block_text(std::size_t b) const {
    std::string s = "block " + std::to_string(b) + " [";
    for (int d = 0; d < blocks[b].rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      s += (d ? ", " : "") + std::to_string(blocks[b].offset[u]) + ":" +
           std::to_string(blocks[b].offset[u] + blocks[b].extent[u]);
    }
    return s + "]";
  }
};

inline std::string shape_text(const std::vector<std::int64_t>& s) {
  return shardlib::detail::shape_text(shardlib::detail::ArrayRef<std::int64_t>(s.data(), s.size()));
}

/// A file access property list with the HDF5 1.8+ object formats (checksummed metadata).
inline h5::Handle file_access() {
  h5::Handle fapl = h5::check(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "H5Pcreate");
  h5::check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_LATEST), "H5Pset_libver_bounds");
  return fapl;
}

/// An open checkpoint: its HDF5 file (the metadata) and a POSIX descriptor of the very same
/// file, whose FileId says which file it is. Holding it keeps that file readable (and its
/// FileId unique) after `path` has been renamed over by a newer save.
struct OpenCheckpoint {
  std::unique_ptr<PosixFile> posix;
  FileId id;
  h5::Handle file;

  OpenCheckpoint() = default;
  OpenCheckpoint(OpenCheckpoint&&) noexcept = default;
  OpenCheckpoint& operator=(OpenCheckpoint&&) noexcept = default;
  ~OpenCheckpoint() {  // HDF5 is not thread-safe: its file is closed under the lock
    if (file) {
      auto lock = h5::hdf5_lock();
      (void)file.close();
    }
  }
};

/// Runs `f`, prefixing the message of an Error it throws with `where` unless it names `path`
/// already: every error of a checkpoint's metadata says which file.
template <class F>
auto naming_file(const std::string& path, const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string what = e.what();
    if (what.find("'" + path + "'") != std::string::npos) throw;
    throw Error(where + ": " + what);
  }
}

/// Opens a checkpoint for reading with clear errors for a missing, unreadable or foreign file.
/// HDF5 opens the file by its path, as does the POSIX descriptor: when the two are different
/// files (a save renamed a new checkpoint over `path` in between), it opens both again.
inline OpenCheckpoint open_checkpoint(const std::string& path) {
  h5::quiet();
  for (int attempt = 0;; ++attempt) {
    OpenCheckpoint c;
    c.posix = std::make_unique<PosixFile>(path, O_RDONLY);  // "cannot open 'x': No such file or directory"
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw Error("'" + path + "' is a directory, not a checkpoint");
    c.id = c.posix->id();
#if H5_VERSION_GE(1, 12, 0)
    const htri_t hdf5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
    const htri_t hdf5 = H5Fis_hdf5(path.c_str());
#endif
    H5Eclear2(H5E_DEFAULT);
    if (hdf5 <= 0) {
      if (c.posix->id() != file_id(path) && attempt < 8) continue;  // replaced while we looked
      throw Error("'" + path + "' is not an HDF5 file (not a shardlib checkpoint)");
    }
    h5::Handle fapl = file_access();
    c.file = h5::check(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose, "cannot open checkpoint '" + path + "'");
    void* handle = nullptr;
    if (H5Fget_vfd_handle(c.file.get(), fapl.get(), &handle) >= 0 && handle) {
      struct stat h5st {};
      if (::fstat(*static_cast<int*>(handle), &h5st) == 0 && FileId::of(h5st) != c.id) {
        if (attempt < 8) continue;
        throw Error("checkpoint '" + path + "' was replaced by another file 9 times while it was being opened");
      }
    }
    H5Eclear2(H5E_DEFAULT);
    naming_file(path, "checkpoint '" + path + "'", [&] {
      if (!h5::has_attr(c.file.get(), "shardlib_format"))
        throw Error("'" + path + "' is an HDF5 file but not a shardlib checkpoint (no shardlib_format attribute)");
      const auto fmt = h5::read_int_attr<std::int64_t>(c.file.get(), "shardlib_format");
      if (fmt.size() != 1 || fmt[0] < 1 || fmt[0] > format_version)
        throw Error("'" + path + "' has checkpoint format " + (fmt.empty() ? std::string("?") : std::to_string(fmt[0])) +
                    "; this shardlib reads format 1.." + std::to_string(format_version));
    });
    return c;
  }
}

/// What is at a path inside a checkpoint: nothing, a dataset, something else (a group), or an
/// object HDF5 cannot read (its header is corrupt; `error` says why).
struct ObjectAt {
  enum Kind { absent, dataset, other, unreadable } kind = absent;
  std::string error;
};
inline ObjectAt object_at(hid_t loc, const char* name) {
  const hid_t obj = H5Oopen(loc, name, H5P_DEFAULT);
  if (obj < 0) return {ObjectAt::unreadable, h5::last_error()};
  const bool yes = H5Iget_type(obj) == H5I_DATASET;
  H5Oclose(obj);
  return {yes ? ObjectAt::dataset : ObjectAt::other, {}};
}

/// The names of the tensors in an open checkpoint (datasets with a shardlib_spec attribute).
/// Throws Error naming the file when its list of objects cannot be read.
inline std::vector<std::string> dataset_names(hid_t file, const std::string& path) {
  std::vector<std::string> names;
  h5::check(H5Lvisit(
                file, H5_INDEX_NAME, H5_ITER_INC,
                [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
                  if (object_at(group, name).kind == ObjectAt::dataset &&
                      H5Aexists_by_name(group, name, "shardlib_spec", H5P_DEFAULT) > 0)
                    static_cast<std::vector<std::string>*>(data)->push_back(name);
                  H5Eclear2(H5E_DEFAULT);
                  return 0;
                },
                &names),
            "checkpoint '" + path + "' is corrupt: its list of tensors cannot be read");
  return names;
}

/// What `name` ("a/b/c") is in `file` (each group on the way checked first, as H5Lexists asks).
inline ObjectAt dataset_at(hid_t file, const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/') return {};
  for (std::size_t at = name.find('/');; at = name.find('/', at + 1)) {
    const std::string prefix = name.substr(0, at);
    const htri_t e = H5Lexists(file, prefix.c_str(), H5P_DEFAULT);
    if (e < 0) return {ObjectAt::unreadable, h5::last_error()};
    if (e == 0) return {};
    if (at == std::string::npos) break;
  }
  return object_at(file, name.c_str());
}

/// Reads the description of dataset `name` of an open checkpoint, checking that it is
/// consistent (its blocks tile its shape, one checksum each, its data inside the file). Every
/// error names the file and the tensor.
inline Stored read_stored(hid_t file, const std::string& path, const std::string& name, std::uint64_t file_size) {
  const std::string where = "checkpoint '" + path + "', tensor '" + name + "'";
  const ObjectAt at = dataset_at(file, name);
  if (at.kind == ObjectAt::unreadable)
    throw Error("checkpoint '" + path + "' is corrupt: tensor '" + name + "' cannot be read (" + at.error + ")");
  if (at.kind != ObjectAt::dataset) {
    std::string have;
    try {
      for (const auto& n : dataset_names(file, path)) have += (have.empty() ? "" : ", ") + n;
    } catch (const Error&) {
      throw Error("checkpoint '" + path + "' has no tensor '" + name + "' (and its list of tensors cannot be read: the file is corrupt)");
    }
    throw Error("checkpoint '" + path + "' has no tensor '" + name + "' (it has: " + (have.empty() ? "none" : have) + ")");
  }
  return naming_file(path, where, [&] {
    h5::Handle ds = h5::check(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose, where);
    Stored s;
    s.info.name = name;
    if (!h5::has_attr(ds.get(), "shardlib_spec")) throw Error(where + ": not written by shardlib (no shardlib_spec attribute)");
    s.info.spec = h5::read_string_attr(ds.get(), "shardlib_spec");
    s.info.mesh = h5::read_string_attr(ds.get(), "shardlib_mesh");
    const std::string dtype = h5::read_string_attr(ds.get(), "shardlib_dtype");
    bool known = false;
    for (int t = 0; t <= static_cast<int>(coll::DType::f64); ++t)
      if (coll::name(static_cast<coll::DType>(t)) == dtype) {
        s.info.dtype = static_cast<coll::DType>(t);
        known = true;
      }
    if (!known) throw Error(where + ": unknown element type '" + dtype + "'");
    h5::Handle type = h5::check(H5Dget_type(ds.get()), H5Tclose, where);
    if (H5Tequal(type.get(), h5::file_type(s.info.dtype)) <= 0)
      throw Error(where + ": the stored type does not match its shardlib_dtype attribute (" + dtype + ")");
    h5::Handle space = h5::check(H5Dget_space(ds.get()), H5Sclose, where);
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (rank < 0 || rank > static_cast<int>(max_tensor_rank)) throw Error(where + ": a dataset of rank " + std::to_string(rank));
    hsize_t dims[max_tensor_rank] = {};
    H5Sget_simple_extent_dims(space.get(), dims, nullptr);
    for (int d = 0; d < rank; ++d) s.info.shape.push_back(static_cast<std::int64_t>(dims[d]));
    h5::Handle dcpl = h5::check(H5Dget_create_plist(ds.get()), H5Pclose, where);
    if (H5Pget_layout(dcpl.get()) != H5D_CONTIGUOUS)
      throw Error(where + ": the dataset is not contiguous (shardlib reads the datasets sl::io::save writes; use io::read for others)");
    const std::int64_t n = s.num_elements();
    const auto bytes = static_cast<std::uint64_t>(n) * coll::size_of(s.info.dtype);
    if (n > 0) {
      const haddr_t off = H5Dget_offset(ds.get());
      if (off == HADDR_UNDEF) throw Error(where + ": the dataset has no data in the file");
      s.offset = off;
      if (s.offset + bytes > file_size)
        throw Error(where + ": its data ends at byte " + std::to_string(s.offset + bytes) + " but the file has " +
                    std::to_string(file_size) + " bytes (the file is truncated)");
    }
    const auto table = h5::read_int_attr<std::int64_t>(ds.get(), "shardlib_blocks");
    s.checksums = h5::read_int_attr<std::uint64_t>(ds.get(), "shardlib_checksums");
    const std::size_t per = 2 * static_cast<std::size_t>(rank);
    if ((per ? table.size() % per != 0 || table.size() / per != s.checksums.size() : s.checksums.size() > 1))
      throw Error(where + ": the block table does not match the checksums (" + std::to_string(table.size()) + " entries, " +
                  std::to_string(s.checksums.size()) + " checksums)");
    std::int64_t covered = 0;
    for (std::size_t b = 0; b < s.checksums.size(); ++b) {
      ShardBox box;
      box.rank = rank;
      for (int d = 0; d < rank; ++d) {
        const auto u = static_cast<std::size_t>(d);
        box.offset[u] = table[b * per + u];
        box.extent[u] = table[b * per + static_cast<std::size_t>(rank) + u];
        if (box.offset[u] < 0 || box.extent[u] < 1 || box.offset[u] + box.extent[u] > s.info.shape[u])
          throw Error(where + ": saved block " + std::to_string(b) + " lies outside the shape " + shape_text(s.info.shape));
      }
      covered += box.num_elements();
      s.blocks.push_back(box);
    }
    if (covered != n)
      throw Error(where + ": the saved blocks cover " + std::to_string(covered) + " of " + std::to_string(n) + " elements");
    return s;
  });
}

/// Broadcasts a byte vector from `root` (its size first).
inline void broadcast_bytes(coll::Communicator& world, std::vector<unsigned char>& bytes, int root) {
  std::uint64_t n = bytes.size();
  world.broadcast(&n, 1, coll::DType::u64, root);
  bytes.resize(static_cast<std::size_t>(n));
  if (n) world.broadcast(bytes.data(), n, coll::DType::u8, root);
}

#if defined(SHARDLIB_HAVE_MPI)
/// The MPI communicator under `world` when the run uses the mpi backend, else MPI_COMM_NULL.
inline MPI_Comm mpi_comm_of(coll::Communicator& world) {
  if (auto* m = dynamic_cast<coll::MpiCommunicator*>(&world)) return m->comm();
  return MPI_COMM_NULL;
}
#endif

/// A tensor to load into, type-erased: `prepare(shape)` checks the file's shape against the
/// target (throwing std::invalid_argument naming both) and allocates a fresh block.
struct Slot {
  std::string name;
  coll::DType dtype;
  Sharding sharding;
  MeshShape mesh;
  std::string what;  // "Spec<...> on Mesh<...>", for messages
  Context* ctx;
  struct Block {
    void* data;
    ShardBox box;
  };
  std::function<Block(const std::vector<std::int64_t>&)> prepare;
};

inline void load_slots(const std::string& path, std::span<Slot> slots, const LoadOptions& opts);

}  // namespace detail

/// Target's option: load into the tensor's own block (the values copied in once the whole load
/// has succeeded) rather than assigning the tensor a new block. For a tensor whose block is
/// viewed elsewhere too, such as a Param an optimizer holds (it keeps viewing the loaded values).
struct InPlace {};
inline constexpr InPlace in_place{};

/// A tensor to load into: a name and a tensor, any mesh and spec (its shape and element type
/// must be the saved ones). Made from `{"name", tensor}` in load()'s list, or `{"name", tensor,
/// io::in_place}`. The tensor is assigned only when the whole load succeeded.
class Target {
 public:
  template <class T, class M, class S, class Mem>
  Target(std::string name, DistributedTensor<T, M, S, Mem>& t)  // NOLINT(google-explicit-constructor)
  {
    auto fresh = make(std::move(name), t);
    commit_ = [fresh, &t] { t = std::move(**fresh); };
  }
  template <class T, class M, class S, class Mem>
  Target(std::string name, DistributedTensor<T, M, S, Mem>& t, InPlace) {
    auto fresh = make(std::move(name), t);
    commit_ = [fresh, &t] {
      const auto& exec = t.context().template exec_for<Mem>();
      Kokkos::deep_copy(exec, t.local(), (*fresh)->local());
      exec.fence();
    };
  }

 private:
  template <class T, class M, class S, class Mem>
  auto make(std::string name, DistributedTensor<T, M, S, Mem>& t) {
    using Tensor = DistributedTensor<T, M, S, Mem>;
    auto fresh = std::make_shared<std::optional<Tensor>>();
    slot_.name = std::move(name);
    slot_.dtype = coll::dtype_of<T>();
    slot_.sharding = Tensor::sharding;
    slot_.mesh = t.mesh().shape();
    slot_.what = Tensor::spec_string() + " on " + t.mesh().to_string();
    slot_.ctx = &t.context();
    slot_.prepare = [fresh, &t, name = slot_.name](const std::vector<std::int64_t>& shape) {
      if (!std::equal(shape.begin(), shape.end(), t.shape().begin(), t.shape().end()))
        throw std::invalid_argument("shardlib::io::load: tensor '" + name + "' has shape " + detail::shape_text(shape) +
                                    " in the checkpoint but the tensor to load it into has shape " +
                                    shardlib::detail::shape_text(t.shape()));
      fresh->emplace(Tensor::uninitialized(t.mesh(), t.shape(), shardlib::detail::same_shape));
      return detail::Slot::Block{(*fresh)->local().data(), (*fresh)->block()};
    };
    return fresh;
  }
  friend inline void load(const std::string&, std::span<const Target>, const LoadOptions&);
  detail::Slot slot_;
  std::function<void()> commit_;
};

/// Saves `tensors` to the HDF5 file `path` (collective: every device calls it, each with the
/// tensors it holds: usually every device the same list; a tensor only some devices hold, such
/// as a pipeline stage's layers, is saved from them, and they must hold all of it, each a block
/// of its spec). Replaces `path` atomically when it exists. Throws
/// std::invalid_argument for an empty or repeated name or tensors of different runs; Error,
/// on every device, when a file operation fails (the previous file at `path` is intact).
inline void save(const std::string& path, std::span<const Entry> tensors, const SaveOptions& opts = {});
/// save() of a list written in place: `save(path, {{"w1", w1}, {"b1", b1}})`. (A list made at run
/// time, a model's parameters: a `std::vector<Entry>`, the span form.)
inline void save(const std::string& path, std::initializer_list<Entry> tensors, const SaveOptions& opts = {}) {
  save(path, std::span<const Entry>(tensors.begin(), tensors.size()), opts);
}

/// Loads the tensors named in `targets` from checkpoint `path` into the given tensors, whatever
/// mesh and spec they have (collective: every device calls it, each with the tensors it holds,
/// as in save()). Throws, with every target unchanged: Error for a
/// missing or unreadable file, a missing name, a failed checksum (naming the tensor and
/// block); std::invalid_argument for a different shape or element type (naming both).
inline void load(const std::string& path, std::span<const Target> targets, const LoadOptions& opts = {});
/// load() of a list written in place (a `std::vector<Target>` made at run time: the span form).
inline void load(const std::string& path, std::initializer_list<Target> targets, const LoadOptions& opts = {}) {
  load(path, std::span<const Target>(targets.begin(), targets.size()), opts);
}

/// Loads tensor `name` of checkpoint `path` as a new `Tensor` on `mesh`, with the saved shape.
template <class Tensor>
Tensor load(const typename Tensor::mesh_type& mesh, const std::string& path, const std::string& name,
            const LoadOptions& opts = {}) {
  std::optional<Tensor> fresh;
  detail::Slot slot{name, coll::dtype_of<typename Tensor::value_type>(), Tensor::sharding, mesh.shape(),
                    Tensor::spec_string() + " on " + mesh.to_string(), &mesh.context(), {}};
  slot.prepare = [&](const std::vector<std::int64_t>& shape) {
    if (shape.size() != Tensor::rank)
      throw std::invalid_argument("shardlib::io::load: tensor '" + name + "' has rank " + std::to_string(shape.size()) +
                                  " in the checkpoint (shape " + detail::shape_text(shape) + ") but " +
                                  Tensor::spec_string() + " has rank " + std::to_string(Tensor::rank));
    typename Tensor::Shape s{};
    if constexpr (Tensor::rank > 0)  // a scalar's Shape is std::array<int64_t, 0>: nothing to copy (g++'s -Wnonnull)
      std::copy(shape.begin(), shape.end(), s.begin());
    fresh.emplace(Tensor::uninitialized(mesh, s, shardlib::detail::same_shape));
    return detail::Slot::Block{fresh->local().data(), fresh->block()};
  };
  detail::load_slots(path, std::span<detail::Slot>(&slot, 1), opts);
  return std::move(*fresh);
}

/// The tensors of checkpoint `path` (any thread; no runtime needed).
inline std::vector<TensorInfo> list(const std::string& path);

/// A whole tensor read into host memory.
template <class T>
struct HostArray {
  std::vector<std::int64_t> shape;
  std::vector<T> data;  ///< row-major
};
/// Reads tensor `name` of checkpoint `path` whole into host memory, checking its checksums
/// (any thread; no runtime needed). Throws std::invalid_argument when `T` is not its element
/// type, Error as load() does.
template <class T>
HostArray<T> read(const std::string& path, const std::string& name, const LoadOptions& opts = {});

}  // namespace io
}  // namespace shardlib

#include <shardlib/io/checkpoint_impl.hpp>
