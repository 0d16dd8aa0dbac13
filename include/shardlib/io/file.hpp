// SPDX-License-Identifier: Apache-2.0
/// @file
/// Moving one block of a tensor between memory and its dataset in a file: the dataset is the
/// global tensor, row-major and contiguous at byte `base` of the file, and the block is a box
/// of it. Writes: POSIX `pwrite` of the block's contiguous runs, one writer per device on every
/// backend (each write's result checked: MPI-IO's OMPIO drops its aggregators' write errors and
/// reports success). Reads: `pread` (threads backend), or MPI-IO collective calls with a
/// subarray file view (mpi backend), whose errors are latched in the MpiFile and raised only
/// after the last collective call, so that no rank leaves the others waiting.
///
/// Knows files and boxes only: no tensors, no communicator beyond the MPI file handle.
#pragma once
#include <shardlib/io/hdf5.hpp>
#include <shardlib/sharding/block.hpp>

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(SHARDLIB_HAVE_MPI)
#include <mpi.h>
#endif

namespace shardlib::io::detail {

/// Calls f(file_byte, buffer_byte, bytes) for each contiguous run of box `part` of a tensor of
/// global `shape` (elements of `elem` bytes), file offsets relative to the dataset and buffer
/// offsets in a row-major buffer holding box `layout`. Trailing dims that `part` covers whole,
/// in the file and in the buffer, merge into one run.
template <class F>
void for_each_run(const ShardBox& layout, const ShardBox& part, shardlib::detail::ArrayRef<std::int64_t> shape,
                  std::size_t elem, F f) {
  const std::int64_t n = part.num_elements();
  if (n == 0) return;
  const int r = part.rank;
  if (r == 0) {
    f(std::uint64_t{0}, std::uint64_t{0}, static_cast<std::uint64_t>(elem));
    return;
  }
  int m = r - 1;  // dims m..r-1 form one run
  std::int64_t run = part.extent[static_cast<std::size_t>(m)];
  while (m > 0 && part.extent[static_cast<std::size_t>(m)] == shape[static_cast<std::size_t>(m)] &&
         part.extent[static_cast<std::size_t>(m)] == layout.extent[static_cast<std::size_t>(m)]) {
    --m;
    run *= part.extent[static_cast<std::size_t>(m)];
  }
  std::int64_t idx[max_tensor_rank] = {};  // multi-index of the run inside `part`, dims 0..m-1
  for (std::int64_t done = 0; done < n; done += run) {
    std::int64_t fk = 0, bk = 0;
    for (int d = 0; d < r; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const std::int64_t g = part.offset[u] + (d < m ? idx[d] : 0);
      fk = fk * shape[u] + g;
      bk = bk * layout.extent[u] + (g - layout.offset[u]);
    }
    f(static_cast<std::uint64_t>(fk) * elem, static_cast<std::uint64_t>(bk) * elem, static_cast<std::uint64_t>(run) * elem);
    for (int d = m - 1; d >= 0; --d) {
      if (++idx[d] < part.extent[static_cast<std::size_t>(d)]) break;
      idx[d] = 0;
    }
  }
}

/// "what 'path': strerror(errno)".
inline std::string errno_text(const std::string& what, const std::string& path, int err) {
  return what + " '" + path + "': " + std::strerror(err);
}

/// Which file an open descriptor or a path is: device, inode, size and modification time (not the
/// change time: renaming the file, or a rename over it that unlinks it, changes that). Two opens
/// of one path that give different FileIds opened different files (the path was renamed over in
/// between); an inode held open cannot be reused by another file.
struct FileId {
  std::uint64_t dev = 0, ino = 0, size = 0, mtime_ns = 0;
  static FileId of(const struct stat& st) noexcept {
    const auto ns = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000u + static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
    return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
            static_cast<std::uint64_t>(st.st_size), ns};
  }
  friend bool operator==(const FileId&, const FileId&) = default;
};

/// The FileId of the file at `path` now (throws Error naming it).
inline FileId file_id(const std::string& path);

/// An open POSIX file, closed on destruction.
class PosixFile {
 public:
  PosixFile(std::string path, int flags, mode_t mode = 0644) : path_(std::move(path)) {
    do fd_ = ::open(path_.c_str(), flags | O_CLOEXEC, mode);
    while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) throw Error(errno_text((flags & (O_WRONLY | O_RDWR)) ? "cannot open for writing" : "cannot open", path_, errno));
  }
  /// Another PosixFile's descriptor, borrowed (not closed here): the in-process devices of a load
  /// read the very file device 0 opened.
  struct Borrowed {
    int fd;
  };
  PosixFile(Borrowed b, std::string path) : path_(std::move(path)), fd_(b.fd), owned_(false) {}
  PosixFile(const PosixFile&) = delete;
  PosixFile& operator=(const PosixFile&) = delete;
  ~PosixFile() {
    if (fd_ >= 0 && owned_) ::close(fd_);
  }
  const std::string& path() const noexcept { return path_; }
  /// The descriptor, to lend (see Borrowed).
  int fd() const noexcept { return fd_; }

  void pwrite_all(const void* buf, std::uint64_t bytes, std::uint64_t offset) {
    auto* p = static_cast<const unsigned char*>(buf);
    while (bytes > 0) {
      const ssize_t w = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error(errno_text("writing " + std::to_string(bytes) + " bytes at byte " + std::to_string(offset) + " of", path_, w < 0 ? errno : ENOSPC));
      p += w;
      bytes -= static_cast<std::uint64_t>(w);
      offset += static_cast<std::uint64_t>(w);
    }
  }
  void pread_all(void* buf, std::uint64_t bytes, std::uint64_t offset) {
    auto* p = static_cast<unsigned char*>(buf);
    while (bytes > 0) {
      const ssize_t r = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw Error(errno_text("reading " + std::to_string(bytes) + " bytes at byte " + std::to_string(offset) + " of", path_, errno));
      if (r == 0)
        throw Error("'" + path_ + "' ends before byte " + std::to_string(offset + bytes) + " (the file is truncated)");
      p += r;
      bytes -= static_cast<std::uint64_t>(r);
      offset += static_cast<std::uint64_t>(r);
    }
  }
  /// Starts writing `bytes` at `offset` to the disk without waiting (a hint; Linux only: the
  /// fsync that follows reports any error).
  void start_writeback([[maybe_unused]] std::uint64_t offset, [[maybe_unused]] std::uint64_t bytes) noexcept {
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
    (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE);
#endif
  }
  /// Reserves the file's first `bytes` on the disk (Linux fallocate: no data written), so that a
  /// disk that cannot hold them fails here, before anything is written. A file system without
  /// fallocate (EOPNOTSUPP) reserves nothing: the writes' own checks then catch a full disk.
  void reserve([[maybe_unused]] std::uint64_t bytes) {
#if defined(__linux__)
    if (bytes == 0) return;
    int r = 0;
    do r = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
    while (r != 0 && errno == EINTR);
    if (r != 0 && errno != EOPNOTSUPP && errno != ENOSYS)
      throw Error(errno_text("reserving " + std::to_string(bytes) + " bytes for", path_, errno));
#endif
  }
  /// Which file this descriptor has open.
  FileId id() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(errno_text("cannot stat", path_, errno));
    return FileId::of(st);
  }
  /// Writes the file's data to the disk (fsync).
  void sync() {
    if (::fsync(fd_) != 0) throw Error(errno_text("fsync of", path_, errno));
  }
  /// Closes now, reporting a failed close (a delayed write error).
  void close() {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && owned_ && ::close(fd) != 0 && errno != EINTR) throw Error(errno_text("closing", path_, errno));
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool owned_ = true;
};

inline FileId file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(errno_text("cannot stat", path, errno));
  return FileId::of(st);
}

/// Writes box `part` of a buffer holding box `layout` to the dataset at byte `base`.
inline void write_box(PosixFile& f, std::uint64_t base, shardlib::detail::ArrayRef<std::int64_t> shape, std::size_t elem,
                      const void* buf, const ShardBox& layout, const ShardBox& part) {
  for_each_run(layout, part, shape, elem, [&](std::uint64_t fo, std::uint64_t bo, std::uint64_t bytes) {
    f.pwrite_all(static_cast<const unsigned char*>(buf) + bo, bytes, base + fo);
  });
}
/// Reads box `part` of the dataset at byte `base` into a buffer holding box `layout`.
inline void read_box(PosixFile& f, std::uint64_t base, shardlib::detail::ArrayRef<std::int64_t> shape, std::size_t elem,
                     void* buf, const ShardBox& layout, const ShardBox& part) {
  for_each_run(layout, part, shape, elem, [&](std::uint64_t fo, std::uint64_t bo, std::uint64_t bytes) {
    f.pread_all(static_cast<unsigned char*>(buf) + bo, bytes, base + fo);
  });
}

/// Removes `path` if it exists, ignoring errors (cleanup after a failure).
inline void remove_quietly(const std::string& path) noexcept { (void)::unlink(path.c_str()); }

/// The directory part of `path` ("." when it has none).
inline std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// Makes a rename in `dir` durable (fsync of the directory); errors are reported.
inline void sync_dir(const std::string& dir) {
  PosixFile d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

#if defined(SHARDLIB_HAVE_MPI)
/// MPI's message for an error code.
inline std::string mpi_error_text(int code) {
  char s[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, s, &n);
  return std::string(s, static_cast<std::size_t>(n));
}

/// An MPI file open on a communicator for reading, closed on destruction. MPI-IO returns its
/// errors (MPI_ERRORS_RETURN is the default for files); a failed call is *latched*, not thrown:
/// the collective calls that follow are still made (with nothing to move), so every rank makes
/// the same sequence of collective calls whatever failed where, and `close_and_rethrow()` throws
/// the first error after the last of them. Open is collective and fails alike on every rank.
class MpiFile {
 public:
  MpiFile(MPI_Comm comm, std::string path) : path_(std::move(path)), comm_(comm) {
    const int rc = MPI_File_open(comm, path_.c_str(), MPI_MODE_RDONLY, MPI_INFO_NULL, &fh_);
    if (rc != MPI_SUCCESS) throw Error("MPI_File_open of '" + path_ + "': " + mpi_error_text(rc));
  }
  MpiFile(const MpiFile&) = delete;
  MpiFile& operator=(const MpiFile&) = delete;
  ~MpiFile() {
    if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
  }
  MPI_File get() const noexcept { return fh_; }
  MPI_Comm comm() const noexcept { return comm_; }
  const std::string& path() const noexcept { return path_; }
  /// Whether a call has failed on this rank.
  bool failed() const noexcept { return !error_.empty(); }
  /// Latches "what 'path': MPI's message" when `code` is an error; returns whether it was not.
  bool check(int code, const std::string& what) {
    if (code == MPI_SUCCESS) return true;
    fail(what + " '" + path_ + "': " + mpi_error_text(code));
    return false;
  }
  /// Latches `message` (the first one is kept).
  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }
  /// Runs `f` unless a call failed already; latches what it throws.
  template <class F>
  void attempt(F&& f) {
    if (failed()) return;
    try {
      f();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
  /// Reads `bytes` at byte `offset` of the file (independent; the file's view must be bytes).
  void read_at(std::uint64_t offset, void* buf, std::uint64_t bytes) {
    auto* p = static_cast<unsigned char*>(buf);
    while (bytes > 0 && !failed()) {  // counts are ints: 1 GiB at a time
      const int n = static_cast<int>(std::min<std::uint64_t>(bytes, std::uint64_t{1} << 30));
      MPI_Status st;
      if (!check(MPI_File_read_at(fh_, static_cast<MPI_Offset>(offset), p, n, MPI_BYTE, &st), "MPI_File_read_at from")) return;
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      if (got != n)
        return fail("'" + path_ + "' ends before byte " + std::to_string(offset + static_cast<std::uint64_t>(n)) +
                    " (the file is truncated)");
      p += n;
      offset += static_cast<std::uint64_t>(n);
      bytes -= static_cast<std::uint64_t>(n);
    }
  }
  /// Closes the file (collective), then throws this rank's first latched error, if any.
  void close_and_rethrow() {
    if (fh_ != MPI_FILE_NULL) check(MPI_File_close(&fh_), "MPI_File_close of");
    if (failed()) throw Error(error_);
  }

 private:
  std::string path_;
  MPI_Comm comm_;
  MPI_File fh_ = MPI_FILE_NULL;
  std::string error_;
};

/// An owned MPI datatype.
struct MpiType {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  MpiType() = default;
  MpiType(const MpiType&) = delete;
  MpiType& operator=(const MpiType&) = delete;
  ~MpiType() {
    if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
  }
};

/// Whether `box` is one contiguous run of the file on every rank (collective; an empty box
/// counts as one). Then sets the file's view to bytes, for explicit offsets.
inline bool mpi_all_one_run(MpiFile& f, const ShardBox& box, shardlib::detail::ArrayRef<std::int64_t> shape, std::size_t elem) {
  int runs = 0;
  for_each_run(box, box, shape, elem, [&](std::uint64_t, std::uint64_t, std::uint64_t) { ++runs; });
  int one = runs <= 1;
  MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_INT, MPI_LAND, f.comm());
  if (one) {
    char native[] = "native";
    f.check(MPI_File_set_view(f.get(), 0, MPI_BYTE, MPI_BYTE, native, MPI_INFO_NULL), "MPI_File_set_view of");
  }
  return one != 0;
}

/// Throws Error past MPI's int counts: the element count of a box for one MPI-IO call.
inline int mpi_count(const MpiFile& f, const ShardBox& box) {
  const std::int64_t n = box.num_elements();
  if (n > INT32_MAX)
    throw Error("a block of " + std::to_string(n) + " elements is more than MPI-IO's count limit (2^31 - 1) for '" + f.path() + "'");
  return static_cast<int>(n);
}

/// Collective over the file's communicator, for boxes that are not one run on some rank: every
/// rank reads its `box` (row-major at `buf`; an empty box reads nothing) of the dataset at byte
/// `base` through a subarray view, with an independent read (measured here with 8 ranks on 2
/// cores: a column-split 256 MiB load took 0.99 s collectively, 0.44 s independently). A rank
/// whose earlier call failed (or whose view cannot be made) still sets a view, reading nothing.
inline void mpi_read_strided_box(MpiFile& f, std::uint64_t base, shardlib::detail::ArrayRef<std::int64_t> shape,
                                 std::size_t elem, void* buf, const ShardBox& box) {
  int count = 0;
  MpiType etype, ftype;
  MPI_Datatype e = MPI_BYTE, view = MPI_BYTE;
  f.attempt([&] {
    count = mpi_count(f, box);
    if (!f.check(MPI_Type_contiguous(static_cast<int>(elem), MPI_BYTE, &etype.t), "MPI_Type_contiguous for") ||
        !f.check(MPI_Type_commit(&etype.t), "MPI_Type_commit for"))
      return;
    e = view = etype.t;
    if (count == 0 || box.rank == 0) return;
    int sizes[max_tensor_rank], sub[max_tensor_rank], start[max_tensor_rank];
    for (int d = 0; d < box.rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      if (shape[u] > INT32_MAX)
        throw Error("dim " + std::to_string(d) + " of extent " + std::to_string(shape[u]) +
                    " is more than MPI-IO's limit (2^31 - 1) for '" + f.path() + "'");
      sizes[d] = static_cast<int>(shape[u]);
      sub[d] = static_cast<int>(box.extent[u]);
      start[d] = static_cast<int>(box.offset[u]);
    }
    if (f.check(MPI_Type_create_subarray(box.rank, sizes, sub, start, MPI_ORDER_C, etype.t, &ftype.t),
                "MPI_Type_create_subarray for") &&
        f.check(MPI_Type_commit(&ftype.t), "MPI_Type_commit for"))
      view = ftype.t;
  });
  if (f.failed()) {  // this rank reads nothing, but the view is set collectively
    count = 0;
    e = view = MPI_BYTE;
  }
  char native[] = "native";
  f.check(MPI_File_set_view(f.get(), static_cast<MPI_Offset>(base), e, view, native, MPI_INFO_NULL), "MPI_File_set_view of");
  if (f.failed() || count == 0) return;  // MPI_File_read is independent: nothing to match
  MPI_Status st;
  if (!f.check(MPI_File_read(f.get(), buf, count, e, &st), "MPI_File_read from")) return;
  int got = 0;
  MPI_Get_count(&st, e, &got);
  if (got != count)
    f.fail("'" + f.path() + "' ends before the block's last element (read " + std::to_string(got) + " of " +
           std::to_string(count) + " elements; the file is truncated)");
}
#endif

}  // namespace shardlib::io::detail
