// SPDX-License-Identifier: Apache-2.0
/// @file
/// The definitions of io/checkpoint.hpp's save, load, list and read (see that file's comment).
#pragma once
#include <shardlib/io/checkpoint.hpp>

namespace shardlib::io {
namespace detail {

/// "name" is usable as a dataset path: non-empty, no leading, trailing or doubled '/', not ".".
inline void check_name(const std::string& name, const char* fn) {
  const bool bad = name.empty() || name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos ||
                   name == "." || name.find("/./") != std::string::npos || name.rfind("./", 0) == 0;
  if (bad)
    throw std::invalid_argument(std::string("shardlib::io::") + fn + ": tensor name '" + name +
                                "' is not usable (names are non-empty, '/'-separated groups, no empty or '.' parts)");
}

inline void check_names_unique(const std::vector<std::string>& names, const char* fn) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    check_name(names[i], fn);
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw std::invalid_argument(std::string("shardlib::io::") + fn + ": tensor name '" + names[i] +
                                    "' appears twice in one call");
  }
}

/// A fresh temporary name next to `path`, the same on every device (device 0 picks it).
inline std::string temp_name(const std::string& path) {
  std::random_device rd;
  const std::uint64_t r = (std::uint64_t{rd()} << 32) ^ rd() ^ static_cast<std::uint64_t>(::getpid());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r));
  return path + ".tmp-" + hex;
}

/// Device 0's part of a save: creates `tmp` with every dataset (space allocated, not
/// written) and its attributes; returns each dataset's file offset.
inline std::vector<std::uint64_t> write_metadata(const std::string& path, const std::string& tmp,
                                                 const std::vector<std::vector<ShardBox>>& blocks,
                                                 const std::vector<std::vector<std::uint64_t>>& sums,
                                                 const std::vector<std::string>& names,
                                                 const std::vector<std::vector<std::int64_t>>& shapes,
                                                 const std::vector<coll::DType>& dtypes,
                                                 const std::vector<std::string>& specs,
                                                 const std::vector<std::string>& meshes) {
  h5::quiet();
  auto lock = h5::hdf5_lock();
  {  // created here first: a clear errno message for a missing directory or no permission
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      throw Error("shardlib::io::save: cannot create checkpoint '" + path + "' (in directory '" + parent_dir(path) +
                  "'): " + std::strerror(err));
    }
    ::close(fd);
  }
  h5::Handle fapl = file_access();
  h5::Handle file = h5::check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose,
                              "shardlib::io::save: creating HDF5 file '" + tmp + "'");
  h5::write_attr(file.get(), "shardlib_format", std::vector<std::int64_t>{format_version});
  h5::write_attr(file.get(), "shardlib_version", std::string(SHARDLIB_VERSION_STRING));
  h5::Handle lcpl = h5::check(H5Pcreate(H5P_LINK_CREATE), H5Pclose, "H5Pcreate");
  h5::check(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group");
  h5::Handle dcpl = h5::check(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "H5Pcreate");
  h5::check(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  h5::check(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
  h5::check(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  std::vector<std::uint64_t> offsets(names.size(), 0);
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string where = "shardlib::io::save: tensor '" + names[i] + "' in '" + path + "'";
    const auto& shape = shapes[i];
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    h5::Handle space = h5::check(dims.empty() ? H5Screate(H5S_SCALAR)
                                              : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                 H5Sclose, where);
    h5::Handle ds = h5::check(H5Dcreate2(file.get(), names[i].c_str(), h5::file_type(dtypes[i]), space.get(), lcpl.get(),
                                         dcpl.get(), H5P_DEFAULT),
                              H5Dclose, where + ": creating its dataset");
    h5::write_attr(ds.get(), "shardlib_dtype", std::string(coll::name(dtypes[i])));
    h5::write_attr(ds.get(), "shardlib_spec", specs[i]);
    h5::write_attr(ds.get(), "shardlib_mesh", meshes[i]);
    std::vector<std::int64_t> table;
    for (const ShardBox& b : blocks[i]) {
      for (int d = 0; d < b.rank; ++d) table.push_back(b.offset[static_cast<std::size_t>(d)]);
      for (int d = 0; d < b.rank; ++d) table.push_back(b.extent[static_cast<std::size_t>(d)]);
    }
    h5::write_attr(ds.get(), "shardlib_blocks", table);
    h5::write_attr(ds.get(), "shardlib_checksums", sums[i]);
    if (!blocks[i].empty()) {
      const haddr_t at = H5Dget_offset(ds.get());
      if (at == HADDR_UNDEF) throw Error(where + ": HDF5 allocated no space for its data: " + h5::last_error());
      offsets[i] = at;
    }
  }
  if (!file.close()) throw Error("shardlib::io::save: writing the metadata of '" + tmp + "': " + h5::last_error());
  return offsets;
}

/// The size of the slabs a device writes or reads at a time (32 MiB: a cold 256 MiB file read in
/// 8 MiB preads took 1.2x as long as in one read, in 32 or 64 MiB ones about the same; tests make
/// it small).
inline std::int64_t& slab_bytes() {
  static std::int64_t bytes = std::int64_t{32} << 20;
  return bytes;
}

/// Device 0, after the data: sets each dataset's saved-block checksums in the temporary file.
inline void write_checksums(const std::string& tmp, const std::vector<std::string>& names,
                            const std::vector<std::vector<std::uint64_t>>& sums) {
  auto lock = h5::hdf5_lock();
  h5::Handle fapl = file_access();
  h5::Handle file = h5::check(H5Fopen(tmp.c_str(), H5F_ACC_RDWR, fapl.get()), H5Fclose,
                              "shardlib::io::save: reopening '" + tmp + "'");
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (sums[i].empty()) continue;
    h5::Handle ds = h5::check(H5Dopen2(file.get(), names[i].c_str(), H5P_DEFAULT), H5Dclose,
                              "shardlib::io::save: tensor '" + names[i] + "'");
    h5::Handle attr = h5::check(H5Aopen(ds.get(), "shardlib_checksums", H5P_DEFAULT), H5Aclose,
                                "shardlib::io::save: tensor '" + names[i] + "'");
    h5::check(H5Awrite(attr.get(), H5T_NATIVE_UINT64, sums[i].data()), "shardlib::io::save: tensor '" + names[i] + "'");
  }
  if (!file.close()) throw Error("shardlib::io::save: writing the checksums to '" + tmp + "': " + h5::last_error());
}

/// The file bytes from the first element of `b` to its last, for a dataset of `shape` at `base`.
inline std::pair<std::uint64_t, std::uint64_t> file_range(std::uint64_t base, shardlib::detail::ArrayRef<std::int64_t> shape,
                                                          std::size_t elem, const ShardBox& b) {
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < b.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    lo = lo * shape[u] + b.offset[u];
    hi = hi * shape[u] + b.offset[u] + b.extent[u] - 1;
  }
  return {base + static_cast<std::uint64_t>(lo) * elem, static_cast<std::uint64_t>(hi - lo + 1) * elem};
}

/// The threads a device may sum checksums on: its share of the machine's cores (the cores over
/// the devices of this process under threads, over the MPI ranks of this node under mpi), at
/// least 1.
inline int checksum_lanes(const Context& ctx) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int per_node = ctx.num_devices();
  if (ctx.backend() != "threads") {
    per_node = 1;
    for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
      if (const char* s = std::getenv(v)) {
        per_node = std::max(1, std::atoi(s));
        break;
      }
  }
  return std::max(1, cores / per_node);
}

/// Cuts `box` into slabs of about slab_bytes() along dim 0 and runs `move(slab, next)` on each
/// in order on this thread (`next`: the following slab, or an empty box). After a slab has
/// moved, `sum(part, lane)` runs on each of `lanes` parts of it (row ranges), on helper threads,
/// while the next slab moves: the file's bytes move while the checksums are summed. Each lane
/// is used by one thread at a time (a caller accumulates per lane). A single slab with one lane
/// runs all on this thread.
template <class Move, class Sum>
void pipelined_slabs(const ShardBox& box, std::size_t elem, int lanes, Move move, Sum sum) {
  const std::int64_t rows = box.rank == 0 ? 1 : box.extent[0];
  const std::int64_t row = rows == 0 ? 0 : box.num_elements() / rows;  // elements per index of dim 0
  const std::int64_t step =
      std::max<std::int64_t>(1, slab_bytes() / std::max<std::int64_t>(1, row * static_cast<std::int64_t>(elem)));
  auto rows_of = [&](std::int64_t r, std::int64_t n) {
    ShardBox part = box;
    if (box.rank > 0) {
      part.offset[0] = box.offset[0] + r;
      part.extent[0] = r < rows ? std::min(n, rows - r) : 0;
    }
    return part;
  };
  if (box.rank == 0 || (step >= rows && lanes == 1)) {
    move(box, rows_of(rows, 0));
    sum(box, 0);
    return;
  }
  std::vector<std::future<void>> pending;
  auto join = [&] {
    for (auto& p : pending) p.get();
    pending.clear();
  };
  try {
    for (std::int64_t r = 0; r < rows; r += step) {
      const ShardBox slab = rows_of(r, step);
      move(slab, rows_of(r + step, step));
      join();
      const std::int64_t each = (slab.extent[0] + lanes - 1) / lanes;
      for (int l = 0; l < lanes && l * each < slab.extent[0]; ++l) {
        const ShardBox part = rows_of(r + l * each, std::min(each, slab.extent[0] - l * each));
        pending.push_back(std::async(std::launch::async, [&sum, part, l] { sum(part, l); }));
      }
    }
    join();
  } catch (...) {
    for (auto& p : pending)
      if (p.valid()) p.wait();
    throw;
  }
}

/// Writes `box` (a device's whole block, row-major at `data`) into the dataset at byte `base`
/// and returns its checksum; each slab is summed (on `lanes` threads) while the next is
/// written, and (with `writeback`) the disk starts writing each slab once it is in the page cache.
inline std::uint64_t write_and_checksum(PosixFile& f, std::uint64_t base, shardlib::detail::ArrayRef<std::int64_t> shape,
                                        std::size_t elem, const void* data, const ShardBox& box, bool writeback,
                                        int lanes) {
  std::vector<std::uint64_t> total(static_cast<std::size_t>(lanes), 0);
  pipelined_slabs(
      box, elem, lanes,
      [&](const ShardBox& slab, const ShardBox&) {
        write_box(f, base, shape, elem, data, box, slab);
        if (writeback) {
          const auto [at, bytes] = file_range(base, shape, elem, slab);
          f.start_writeback(at, bytes);
        }
      },
      [&](const ShardBox& part, int lane) { total[static_cast<std::size_t>(lane)] += box_checksum(data, elem, box, part, shape); });
  std::uint64_t sum = 0;
  for (auto t : total) sum += t;
  return sum;
}

/// Reads `box` (a device's whole block, row-major at `data`) from the dataset at byte `base`;
/// adds to parts[b] its share of saved block b's checksum (when `parts` is not null), each slab
/// summed (on `lanes` threads) while the next is read.
/// `read_slab(slab)` fills box `slab` of the buffer. No read-ahead hint: the kernel's own
/// read-ahead of sequential reads measured faster (a posix_fadvise(WILLNEED) per 8 MiB slab made
/// a cold 256 MiB read 1.4x slower).
template <class ReadSlab>
void read_and_checksum(ReadSlab read_slab, shardlib::detail::ArrayRef<std::int64_t> shape, std::size_t elem, void* data,
                       const ShardBox& box, const std::vector<ShardBox>& saved, std::uint64_t* parts, int lanes) {
  std::vector<std::vector<std::uint64_t>> acc(static_cast<std::size_t>(lanes), std::vector<std::uint64_t>(saved.size(), 0));
  pipelined_slabs(
      box, elem, lanes, [&](const ShardBox& slab, const ShardBox&) { read_slab(slab); },
      [&](const ShardBox& part, int lane) {
        if (!parts) return;
        for (std::size_t b = 0; b < saved.size(); ++b)
          acc[static_cast<std::size_t>(lane)][b] += box_checksum(data, elem, box, shardlib::intersect(saved[b], part), shape);
      });
  if (parts)
    for (const auto& a : acc)
      for (std::size_t b = 0; b < saved.size(); ++b) parts[b] += a[b];
}

}  // namespace detail

inline void save(const std::string& path, std::span<const Entry> tensors, const SaveOptions& opts) {
  if (path.empty()) throw std::invalid_argument("shardlib::io::save: the path is empty");
  if (tensors.size() == 0) throw std::invalid_argument("shardlib::io::save: no tensors to save to '" + path + "'");
  std::vector<const Entry*> es;
  std::vector<std::string> own;
  for (const Entry& e : tensors) {
    es.push_back(&e);
    own.push_back(e.name_);
  }
  detail::check_names_unique(own, "save");
  Context& ctx = *es[0]->ctx_;
  for (const Entry* e : es)
    if (e->ctx_ != &ctx)
      throw std::invalid_argument("shardlib::io::save: tensor '" + e->name_ + "' belongs to another run than '" +
                                  es[0]->name_ + "'");
  coll::Communicator& world = ctx.world();
  const int dev = ctx.device(), ndev = world.size();

  // 0. Who holds what (io/holding.hpp): every device's tensors, each with its type, shape,
  //    layout and block. The first holder of each distinct block writes it (replicas write
  //    nothing); a tensor held by some devices only (a pipeline stage's) is saved from them.
  std::vector<std::string> records;
  for (const Entry* e : es) {
    detail::Writer w;
    w.u64(static_cast<std::uint64_t>(e->dtype_));
    w.shape(e->shape_);
    w.str(e->spec_);
    w.str(e->mesh_.to_string());
    w.box(e->box_);
    records.emplace_back(w.bytes.begin(), w.bytes.end());
  }
  const detail::Holding held = detail::gather_holding(world, own, records);
  const std::vector<std::string>& names = held.names;
  const std::size_t n = names.size();
  struct Described {
    coll::DType dtype{};
    std::vector<std::int64_t> shape;
    std::string spec, mesh;
    std::vector<ShardBox> blocks;  // the distinct blocks, in the order of their first holders
    std::vector<int> block_device;  // the device that writes each
  };
  std::vector<Described> desc(n);
  std::vector<char> writes(n, 0);  // whether this device writes tensor i's block
  for (std::size_t i = 0; i < n; ++i) {  // (every device checks the same records: all throw alike)
    Described& t = desc[i];
    std::vector<ShardBox> boxes;
    for (std::size_t k = 0; k < held.holders[i].size(); ++k) {
      detail::Reader r{held.records[i][k]};
      const auto dtype = static_cast<coll::DType>(r.u64());
      auto shape = r.shape();
      std::string spec = r.str(), mesh = r.str();
      boxes.push_back(r.box());
      if (k == 0) {
        t = {dtype, std::move(shape), std::move(spec), std::move(mesh), {}, {}};
        continue;
      }
      if (dtype != t.dtype || shape != t.shape || spec != t.spec || mesh != t.mesh)
        throw std::invalid_argument(
            "shardlib::io::save: tensor '" + names[i] + "' is " + std::string(coll::name(t.dtype)) + " " +
            detail::shape_text(t.shape) + " " + t.spec + " on " + t.mesh + " on device " + std::to_string(held.holders[i][0]) +
            " but " + std::string(coll::name(dtype)) + " " + detail::shape_text(shape) + " " + spec + " on " + mesh +
            " on device " + std::to_string(held.holders[i][k]) + " (one name, one tensor)");
    }
    const std::vector<char> first = detail::first_of_each_block(boxes);
    std::int64_t covered = 0, whole = 1;
    for (auto x : t.shape) whole *= x;
    for (std::size_t k = 0; k < boxes.size(); ++k) {
      if (!first[k]) continue;
      for (const ShardBox& b : t.blocks)
        if (intersect(b, boxes[k]).num_elements() > 0) covered = -1;
      if (covered < 0) break;
      t.blocks.push_back(boxes[k]);
      t.block_device.push_back(held.holders[i][k]);
      covered += boxes[k].num_elements();
      if (held.holders[i][k] == dev) writes[i] = 1;
    }
    if (covered != whole) {
      std::string who;
      for (int d : held.holders[i]) who += (who.empty() ? "" : ", ") + std::to_string(d);
      throw std::invalid_argument("shardlib::io::save: tensor '" + names[i] + "' (" + detail::shape_text(t.shape) + " " +
                                  t.spec + " on " + t.mesh + ") is held by device(s) " + who + ", whose blocks " +
                                  (covered < 0 ? "overlap" : "cover " + std::to_string(covered) + " of its " +
                                                                 std::to_string(whole) + " elements") +
                                  ": the devices that hold a tensor must hold all of it, each a block of its spec");
    }
  }
  auto shape_of = [&](std::size_t i) {
    return shardlib::detail::ArrayRef<std::int64_t>(desc[i].shape.data(), desc[i].shape.size());
  };
  auto entry = [&](std::size_t i) -> const Entry& { return *es[static_cast<std::size_t>(held.local[i])]; };

  // 1. Device 0 writes the metadata to a temporary file (checksums as zeros until step 3) and
  //    reserves the whole file on the disk: a disk that cannot hold it fails here, before any
  //    device has written a byte.
  std::string tmp;
  bool created = false;
  auto cleanup = [&] {
    if (dev == 0 && created) detail::remove_quietly(tmp);
  };
  std::vector<unsigned char> blob;
  detail::agree(world, [&] {
    if (dev != 0) return;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      throw Error("shardlib::io::save: '" + path + "' is a directory");
    std::vector<std::vector<ShardBox>> blocks(n);
    std::vector<std::vector<std::uint64_t>> sums(n);
    std::vector<std::vector<std::int64_t>> shapes(n);
    std::vector<coll::DType> dtypes(n);
    std::vector<std::string> specs(n), meshes(n);
    std::uint64_t end = 0;  // the file's size: every dataset's last byte
    for (std::size_t i = 0; i < n; ++i) {
      shapes[i] = desc[i].shape;
      dtypes[i] = desc[i].dtype;
      specs[i] = desc[i].spec;
      meshes[i] = desc[i].mesh;
      blocks[i] = desc[i].blocks;
      sums[i].assign(blocks[i].size(), 0);
    }
    tmp = detail::temp_name(path);
    created = true;
    const auto offsets = detail::write_metadata(path, tmp, blocks, sums, names, shapes, dtypes, specs, meshes);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t bytes = coll::size_of(dtypes[i]);
      for (auto x : shapes[i]) bytes *= static_cast<std::uint64_t>(x);
      if (!blocks[i].empty()) end = std::max(end, offsets[i] + bytes);
    }
    if (detail::reserve_space()) {
      detail::PosixFile f(tmp, O_WRONLY);
      end = std::max(end, f.id().size);
      try {
        f.reserve(end);
      } catch (const Error& e) {
        throw Error(std::string("shardlib::io::save: checkpoint '") + path + "' does not fit on its disk: " + e.what());
      }
      f.close();
    }
    detail::fault_point("metadata_written", dev);
    detail::Writer w;
    w.str(tmp);
    for (auto o : offsets) w.u64(o);
    blob = std::move(w.bytes);
  }, cleanup);
  detail::broadcast_bytes(world, blob, 0);
  std::vector<std::uint64_t> offsets(n);
  {
    detail::Reader r{blob};
    tmp = r.str();
    for (auto& o : offsets) o = r.u64();
  }

  // 2. Every device writes the blocks it holds first-hand into the datasets, and their checksums,
  //    with POSIX writes whose every result is checked (on every backend: MPI-IO's OMPIO reports
  //    success for writes its aggregators failed). Under mpi each process also makes its own
  //    writes durable (fsync of its descriptor: on a shared file system, a client flushes its own
  //    pages); in-process devices share the page cache, which step 3's fsync flushes. A failure on
  //    any device fails the save on every device, with that device's message (agree).
  std::uint64_t written = 0;
  std::vector<std::uint64_t> mine(n, 0), all(n * static_cast<std::size_t>(ndev), 0);
  detail::agree(world, [&] {
    detail::fault_point("write", dev);
    if (std::find(writes.begin(), writes.end(), 1) == writes.end()) return;
    detail::PosixFile f(tmp, O_WRONLY);
    for (std::size_t i = 0; i < n; ++i) {
      if (!writes[i]) continue;
      const Entry& e = entry(i);
      try {
        mine[i] = detail::write_and_checksum(f, offsets[i], shape_of(i), coll::size_of(e.dtype_), e.data_, e.box_,
                                             opts.durable, detail::checksum_lanes(ctx));
      } catch (const Error& x) {
        throw Error("shardlib::io::save: device " + std::to_string(dev) + ", tensor '" + e.name_ + "' of checkpoint '" +
                    path + "': " + x.what());
      }
      written += static_cast<std::uint64_t>(e.box_.num_elements()) * coll::size_of(e.dtype_);
    }
    if (opts.durable && ctx.backend() != "threads") f.sync();
    f.close();
  }, cleanup);
  world.all_gather(mine.data(), all.data(), n, coll::DType::u64);

  // 3. Device 0 records the checksums, makes the file durable and renames it over `path`.
  detail::agree(world, [&] {
    if (dev != 0) return;
    std::vector<std::vector<std::uint64_t>> sums(n);
    for (std::size_t i = 0; i < n; ++i)
      for (int d : desc[i].block_device) sums[i].push_back(all[static_cast<std::size_t>(d) * n + i]);
    detail::write_checksums(tmp, names, sums);
    detail::fault_point("data_written", dev);
    if (opts.durable) {
      detail::PosixFile f(tmp, O_RDONLY);
      f.sync();
      f.close();
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(detail::errno_text("shardlib::io::save: cannot rename the finished checkpoint to", path, errno));
    created = false;
    if (opts.durable) detail::sync_dir(detail::parent_dir(path));
  }, cleanup);
  Stats& s = stats(ctx);
  s.bytes_written += written;
  ++s.saves;
}

namespace detail {

/// One attempt at load_slots (below): false when a device found that `path` is no longer the
/// file device 0 described (a save renamed a new checkpoint over it meanwhile), on every device.
inline bool try_load_slots(const std::string& path, std::span<Slot> slots, const LoadOptions& opts) {
  Context& ctx = *slots[0].ctx;
  coll::Communicator& world = ctx.world();
  const int dev = ctx.device();

  // 0. Who loads what (io/holding.hpp): every device's tensors; a tensor some devices load and
  //    others do not (a pipeline stage's) is read by the devices that load it.
  std::vector<std::string> own;
  for (const Slot& s : slots) own.push_back(s.name);
  const Holding held = gather_holding(world, own, std::vector<std::string>(own.size()));
  const std::size_t n = held.names.size();
  auto slot = [&](std::size_t i) -> Slot* {
    return held.local[i] < 0 ? nullptr : &slots[static_cast<std::size_t>(held.local[i])];
  };

  // 1. Device 0 opens the file and reads the descriptions; every device gets them, with the
  //    file's identity. Device 0 holds the file open to the end, so that identity stays its own.
  OpenCheckpoint described;
  std::vector<unsigned char> blob;
  agree(world, [&] {
    if (dev != 0) return;
    auto lock = h5::hdf5_lock();
    described = open_checkpoint(path);
    Writer w;
    for (std::uint64_t v : {described.id.dev, described.id.ino, described.id.size, described.id.mtime_ns})
      w.u64(v);
    w.u64(static_cast<std::uint64_t>(described.posix->fd()));
    for (const std::string& name : held.names) read_stored(described.file.get(), path, name, described.id.size).write(w);
    if (!described.file.close()) H5Eclear2(H5E_DEFAULT);  // read-only: nothing to lose
    blob = std::move(w.bytes);
  });
  broadcast_bytes(world, blob, 0);
  FileId id;
  int fd0 = -1;  // device 0's descriptor of the file (the in-process devices read through it)
  std::vector<Stored> stored;
  {
    Reader r{blob};
    id = {r.u64(), r.u64(), r.u64(), r.u64()};
    fd0 = static_cast<int>(r.u64());
    for (std::size_t i = 0; i < n; ++i) stored.push_back(Stored::read(r));
  }

  // 2. Checks (each device of its own tensors; the first failing device's error is thrown on
  //    every device, as std::invalid_argument), and fresh blocks.
  std::vector<Slot::Block> blocks(n);
  agree(world, [&] {
    for (std::size_t i = 0; i < n; ++i)
      if (const Slot* s = slot(i); s && stored[i].info.dtype != s->dtype)
        throw std::invalid_argument("shardlib::io::load: tensor '" + s->name + "' is " +
                                    std::string(coll::name(stored[i].info.dtype)) + " in checkpoint '" + path +
                                    "' but the tensor to load it into is " + std::string(coll::name(s->dtype)));
    for (std::size_t i = 0; i < n; ++i)
      if (Slot* s = slot(i)) blocks[i] = s->prepare(stored[i].info.shape);
  });

  // Who reads: of a tensor every device loads, the devices that hold a block first-hand (their
  // replicas get it by broadcast, step 5); of a tensor some devices load, each of them, the
  // first holder of each distinct block adding to its checksum.
  std::vector<char> reads(n, 0), sums_here(n, 0);
  for (std::size_t i = 0; i < n; ++i)
    if (held.everywhere(i)) reads[i] = sums_here[i] = is_primary(slot(i)->sharding, slot(i)->mesh, dev);
  if (held.any_partial()) {
    std::vector<std::string> boxes(own.size());
    for (std::size_t i = 0; i < n; ++i)
      if (slot(i)) {
        Writer w;
        w.box(blocks[i].box);
        boxes[static_cast<std::size_t>(held.local[i])].assign(w.bytes.begin(), w.bytes.end());
      }
    const Holding with_boxes = gather_holding(world, own, boxes);  // (the same union, in the same order)
    for (std::size_t i = 0; i < n; ++i) {
      if (held.everywhere(i) || !slot(i)) continue;
      std::vector<ShardBox> b;
      std::size_t me = 0;
      for (std::size_t k = 0; k < with_boxes.holders[i].size(); ++k) {
        Reader r{with_boxes.records[i][k]};
        b.push_back(r.box());
        if (with_boxes.holders[i][k] == dev) me = k;
      }
      reads[i] = 1;
      sums_here[i] = first_of_each_block(b)[me];
    }
  }

  // 3. The readers read their blocks, with partial sums of the saved checksums, from the file
  //    device 0 described: in-process devices through device 0's own descriptor; MPI processes
  //    open the path, and all agree that each opened that file (else every device starts again:
  //    a save renamed a new checkpoint over the path in between).
  std::vector<std::size_t> first_sum(n + 1, 0);
  bool any_read = false;
  for (std::size_t i = 0; i < n; ++i) {
    any_read = any_read || (reads[i] && blocks[i].box.num_elements() > 0);
    first_sum[i + 1] = first_sum[i] + stored[i].blocks.size();
  }
  std::optional<PosixFile> posix;
#if defined(SHARDLIB_HAVE_MPI)
  const MPI_Comm comm = mpi_comm_of(world);
  std::optional<MpiFile> mpi;
#endif
  std::int32_t other = 0;
  agree(world, [&] {
#if defined(SHARDLIB_HAVE_MPI)
    if (comm != MPI_COMM_NULL) {  // collective open; a path whose file is still the described one
      mpi.emplace(comm, path);   // after this open was opened as that file (device 0 holds it open)
      other = file_id(path) != id;
      return;
    }
#endif
    if (!any_read) return;
    if (ctx.backend() == "threads") posix.emplace(PosixFile::Borrowed{fd0}, path);  // device 0 holds it open
    else posix.emplace(path, O_RDONLY);
    other = posix->id() != id;
  });
  std::int32_t replaced = 0;
  world.all_reduce(&other, &replaced, 1, coll::DType::i32, coll::Op::max);
  if (replaced) return false;

  std::vector<std::uint64_t> parts(first_sum[n], 0);
  std::uint64_t read_bytes = 0;
  auto shape_of = [&](std::size_t i) {
    return shardlib::detail::ArrayRef<std::int64_t>(stored[i].info.shape.data(), stored[i].info.shape.size());
  };
  auto sums_of = [&](std::size_t i) { return opts.verify_checksums && sums_here[i] ? parts.data() + first_sum[i] : nullptr; };
  agree(world, [&] {
#if defined(SHARDLIB_HAVE_MPI)
    if (mpi) {
      MpiFile& f = *mpi;  // every rank makes every collective call below; errors are latched
      for (std::size_t i = 0; i < n; ++i) {
        if (stored[i].blocks.empty()) continue;  // an empty tensor: no data, on every device
        const std::size_t elem = coll::size_of(stored[i].info.dtype);
        ShardBox none;  // what a device that reads nothing of it reads
        none.rank = static_cast<int>(stored[i].info.shape.size());
        const bool r = reads[i] && blocks[i].box.num_elements() > 0;
        const ShardBox& mine = r ? blocks[i].box : none;
        std::uint64_t* sums = sums_of(i);
        if (mpi_all_one_run(f, mine, shape_of(i), elem)) {  // independent reads, slab by slab
          if (r)
            f.attempt([&] {
              read_and_checksum(
                  [&](const ShardBox& slab) {
                    for_each_run(mine, slab, shape_of(i), elem, [&](std::uint64_t fo, std::uint64_t bo, std::uint64_t bytes) {
                      f.read_at(stored[i].offset + fo, static_cast<unsigned char*>(blocks[i].data) + bo, bytes);
                    });
                  },
                  shape_of(i), elem, blocks[i].data, mine, stored[i].blocks, sums, checksum_lanes(ctx));
            });
        } else {
          mpi_read_strided_box(f, stored[i].offset, shape_of(i), elem, blocks[i].data, mine);
          if (r && sums && !f.failed())
            for (std::size_t b = 0; b < stored[i].blocks.size(); ++b)
              sums[b] = box_checksum(blocks[i].data, elem, mine, shardlib::intersect(stored[i].blocks[b], mine), shape_of(i));
        }
      }
      f.close_and_rethrow();
    } else
#endif
    {
      for (std::size_t i = 0; i < n; ++i) {
        if (!reads[i] || blocks[i].box.num_elements() == 0) continue;
        const std::size_t elem = coll::size_of(stored[i].info.dtype);
        read_and_checksum(
            [&](const ShardBox& slab) { read_box(*posix, stored[i].offset, shape_of(i), elem, blocks[i].data, blocks[i].box, slab); },
            shape_of(i), elem, blocks[i].data, blocks[i].box, stored[i].blocks, sums_of(i), checksum_lanes(ctx));
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const Slot* s = slot(i);
      if (!s) continue;
      const std::size_t elem = coll::size_of(s->dtype);
      const ShardBox& box = blocks[i].box;
      if (reads[i]) read_bytes += static_cast<std::uint64_t>(box.num_elements()) * elem;
      if ((!reads[i] || !held.everywhere(i)) && box.num_elements() > 0 &&
          shardlib::detail::off_first_coordinate(s->mesh, dev, s->sharding.partial))
        std::memset(blocks[i].data, 0, static_cast<std::size_t>(box.num_elements()) * elem);  // zeros: the sum is the value
    }
  });

  // 4. One all_reduce completes every saved block's checksum.
  if (opts.verify_checksums && !parts.empty()) {
    std::vector<std::uint64_t> sums(parts.size());
    world.all_reduce(parts.data(), sums.data(), parts.size(), coll::DType::u64, coll::Op::sum);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t b = 0; b < stored[i].blocks.size(); ++b)
        if (sums[first_sum[i] + b] != stored[i].checksums[b])
          throw Error("shardlib::io::load: checkpoint '" + path + "' is corrupt: tensor '" + held.names[i] + "', " +
                      stored[i].block_text(b) + " (saved with " + stored[i].info.spec + " on " + stored[i].info.mesh +
                      ") does not match its checksum");
  }

  // 5. Replicas of a tensor every device loads get their block from the device that read it.
  for (std::size_t i = 0; i < n; ++i) {
    if (!held.everywhere(i)) continue;
    const Slot& s = *slot(i);
    const AxisList axes = s.sharding.replicated_axes(s.mesh.rank());
    if (s.mesh.group_size(axes) == 1) continue;
    coll::Communicator& g = ctx.group(s.mesh, axes);
    if (shardlib::detail::off_first_coordinate(s.mesh, dev, s.sharding.partial)) continue;  // zeros, whole group alike
    const auto bytes = static_cast<std::size_t>(blocks[i].box.num_elements()) * coll::size_of(s.dtype);
    if (bytes) g.broadcast(blocks[i].data, bytes, coll::DType::u8, 0);
  }
  Stats& st = stats(ctx);
  st.bytes_read += read_bytes;
  ++st.loads;
  return true;
}

/// Loads `slots` from `path` (see load()). A save that renames a new checkpoint over `path`
/// while the devices open it makes them start again: the load reads the old checkpoint or the
/// new one, whole, never a mix of the two.
inline void load_slots(const std::string& path, std::span<Slot> slots, const LoadOptions& opts) {
  if (slots.empty()) throw std::invalid_argument("shardlib::io::load: no tensors to load from '" + path + "'");
  std::vector<std::string> names;
  for (const Slot& s : slots) names.push_back(s.name);
  check_names_unique(names, "load");
  Context& ctx = *slots[0].ctx;
  for (const Slot& s : slots)
    if (s.ctx != &ctx)
      throw std::invalid_argument("shardlib::io::load: tensor '" + s.name + "' belongs to another run than '" +
                                  slots[0].name + "'");
  constexpr int attempts = 16;
  for (int a = 0; a < attempts; ++a)
    if (try_load_slots(path, slots, opts)) return;
  throw Error("shardlib::io::load: checkpoint '" + path + "' was replaced by a new file " + std::to_string(attempts) +
              " times while the devices opened it (is another program saving it in a loop?)");
}

}  // namespace detail

inline void load(const std::string& path, std::span<const Target> targets, const LoadOptions& opts) {
  std::vector<detail::Slot> slots;
  for (const Target& t : targets) slots.push_back(t.slot_);
  detail::load_slots(path, slots, opts);
  for (const Target& t : targets) t.commit_();  // noexcept moves: all or nothing
}

inline std::vector<TensorInfo> list(const std::string& path) {
  h5::quiet();
  auto lock = h5::hdf5_lock();
  detail::OpenCheckpoint c = detail::open_checkpoint(path);
  std::vector<TensorInfo> out;
  for (const auto& name : detail::dataset_names(c.file.get(), path))
    out.push_back(detail::read_stored(c.file.get(), path, name, c.id.size).info);
  return out;
}

template <class T>
HostArray<T> read(const std::string& path, const std::string& name, const LoadOptions& opts) {
  detail::check_name(name, "read");
  detail::Stored s;
  h5::quiet();
  detail::OpenCheckpoint c;  // its descriptor reads the data: the very file the description came from
  {
    auto lock = h5::hdf5_lock();
    c = detail::open_checkpoint(path);
    s = detail::read_stored(c.file.get(), path, name, c.id.size);
    if (!c.file.close()) H5Eclear2(H5E_DEFAULT);
  }
  if (s.info.dtype != coll::dtype_of<T>())
    throw std::invalid_argument("shardlib::io::read: tensor '" + name + "' is " + std::string(coll::name(s.info.dtype)) +
                                " in checkpoint '" + path + "', not " + std::string(coll::name(coll::dtype_of<T>())));
  HostArray<T> out;
  out.shape = s.info.shape;
  out.data.resize(static_cast<std::size_t>(s.num_elements()));
  if (out.data.empty()) return out;
  c.posix->pread_all(out.data.data(), out.data.size() * sizeof(T), s.offset);
  if (opts.verify_checksums) {
    ShardBox whole;
    whole.rank = static_cast<int>(s.info.shape.size());
    for (int d = 0; d < whole.rank; ++d) whole.extent[static_cast<std::size_t>(d)] = s.info.shape[static_cast<std::size_t>(d)];
    const shardlib::detail::ArrayRef<std::int64_t> shape(s.info.shape.data(), s.info.shape.size());
    for (std::size_t b = 0; b < s.blocks.size(); ++b)
      if (box_checksum(out.data.data(), sizeof(T), whole, s.blocks[b], shape) != s.checksums[b])
        throw Error("shardlib::io::read: checkpoint '" + path + "' is corrupt: tensor '" + name + "', " + s.block_text(b) +
                    " (saved with " + s.info.spec + " on " + s.info.mesh + ") does not match its checksum");
  }
  return out;
}

}  // namespace shardlib::io
