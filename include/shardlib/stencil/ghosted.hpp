// SPDX-License-Identifier: Apache-2.0
/// @file
/// Ghosted views: a tensor's block with ghost layers, filled from the neighbouring blocks.
///
/// `sl::ghosted(u, {1, 1}, sl::Boundary::periodic())` views tensor `u` with one ghost layer on
/// each side of both dims. The block stays where it is (the view reads `u.local()`); the ghost
/// regions (faces, edges, corners: sharding/halo.hpp) live in a buffer of the view's own. When
/// each neighbour sends one piece (the usual case), it travels from the neighbour's block straight
/// into the ghost region, as a strided region of one exchange: no packing of our own (in GPU
/// memory, only where the piece is one contiguous run on its side).
/// `exchange()` refreshes them — collective, one exchange over all devices in which exactly the
/// ghost cells travel, once each — or `start()` ... `finish()` with work in between.
/// stencil/stencil_for.hpp runs stencils over a ghosted view and does this for you.
///
/// A tensor in GPU memory keeps its ghost regions in GPU memory: packing, unpacking and the
/// copies within a device are kernels on the device's instance (its stream), one kernel each for
/// all the pieces of an exchange (kernels::copy_pieces: a strided piece as a copy of its own would
/// be a launch, or a 2-D copy of rows one cell wide, costing more than its cells), and the exchange
/// runs on the device world where the backend has one (threads over GPU memory: device-to-device
/// copies; nccl: grouped sends and receives), queued with no host wait. Under a backend without
/// one (mpi), the ghost cells (only they) are packed on the GPU and go through host memory.
///
/// In shape-only mode (detail/shape_only.hpp) the exchange is the collectives' dry run, its
/// packing, unpacking and copies (kernels) do nothing, and `at` reads zero.
#pragma once

#include <shardlib/detail/shape_only.hpp>
#include <shardlib/execute/block.hpp>
#include <shardlib/kernels/layout.hpp>
#include <shardlib/ops/common.hpp>
#include <shardlib/sharding/halo.hpp>
#include <shardlib/tensor.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardlib {

namespace error {
template <class SpecT>
struct a_partial_tensor_has_no_cells_to_exchange_reshard_it_first;
}  // namespace error

/// Ghost layers of a tensor: `width[d]` cells beyond both sides of dim d, and what the cells
/// beyond the global domain hold on each side (`boundary[d][0]` low, `[d][1]` high).
template <std::size_t R>
struct Ghosts {
  std::array<int, R> width{};
  std::array<std::array<Boundary, 2>, R> boundary{};

  HaloSpec spec() const {
    HaloSpec h;
    h.rank = static_cast<int>(R);
    for (std::size_t d = 0; d < R; ++d) {
      h.width[d] = width[d];
      h.boundary[d] = boundary[d];
    }
    return h;
  }
};

namespace detail {

/// A batch of strided copies run as one (kernels::copy_pieces) and again each time: its table on
/// the host and, in GPU memory, in `Mem` (uploaded once, by `upload`). Sources 0 and 1 and
/// destinations 0 and 1 are the pointers `run` is given, so the table outlives the buffers it
/// was made for (a tensor's block changes when tensors are swapped).
template <class Mem>
struct CopyBatch {
  std::vector<kernels::detail::StridedPiece> pieces;
  Kokkos::View<kernels::detail::StridedPiece*, Mem> table;
  bool ready = false;  // upload() was called: the batch is complete (perhaps empty)

  /// Appends the copy of view `in` of source `from` to view `out` of destination `to` (an empty
  /// one is left out).
  void add(const kernels::detail::StridedView& in, int from, const kernels::detail::StridedView& out, int to) {
    kernels::detail::StridedPiece p;
    p.in = in;
    p.out = out;
    p.from = from;
    p.to = to;
    p.first = pieces.empty() ? 0 : pieces.back().first + pieces.back().in.count();
    if (in.count() > 0) pieces.push_back(p);
  }
  /// Completes the batch: in GPU memory, copies the table there (once; a wait).
  void upload(const Context& ctx) {
    if constexpr (!host_memory_v<Mem>) {
      if (!pieces.empty()) {
        table = Kokkos::View<kernels::detail::StridedPiece*, Mem>(
            Kokkos::view_alloc(Kokkos::WithoutInitializing, "shardlib::ghosts::pieces"), pieces.size());
        detail::upload<Mem>(ctx, pieces.data(), table.data(), static_cast<std::int64_t>(pieces.size()));
      }
    }
    (void)ctx;
    ready = true;
  }
  /// Runs the batch on the device's instance: one kernel, or none when it is empty.
  template <class T>
  void run(const Context& ctx, const char* label, const T* from0, const T* from1, T* to0, T* to1) const {
    if (pieces.empty()) return;
    auto guard = kernel_guard_for<Mem>(ctx, false);
    kernels::copy_pieces(ctx.exec_for<Mem>(), label, std::span<const kernels::detail::StridedPiece>(pieces),
                         host_memory_v<Mem> ? pieces.data() : table.data(), from0, from1, to0, to1);
  }
};

/// The ghost exchange of one device, for blocks of `T` in `Mem` (the runtime-generic part of
/// Ghosted: compiled once per element type and memory space, whatever the spec). `describe` names
/// the tensor in messages.
template <class T, class Mem>
class GhostExchange {
 public:
  GhostExchange(Context& ctx, const Sharding& sharding, const MeshShape& mesh, ArrayRef<std::int64_t> shape, const HaloSpec& h,
                std::string describe)
      : ctx_(&ctx), halo_(h), describe_(std::move(describe)), staged_(!host_memory_v<Mem> && !reshards_on_device<Mem>(ctx)) {
    try {
      plan_ = halo::plan(h, sharding, mesh, shape, ctx.device());
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(e.what()) + " (" + describe_ + ")");
    }
    const int R = h.rank;
    const int regions = halo::region_count(R);
    region_offset_.assign(static_cast<std::size_t>(regions) + 1, 0);
    for (int r = 0; r < regions; ++r) {
      std::int64_t n = 0;
      if (r != halo::centre_region(R) && plan_.block.num_elements() > 0) {
        const auto e = halo::region_extent(r, R, plan_.block.extent, h.width);
        n = 1;
        for (int d = 0; d < R; ++d) n *= e[static_cast<std::size_t>(d)];
      }
      region_offset_[static_cast<std::size_t>(r) + 1] = region_offset_[static_cast<std::size_t>(r)] + n;
    }
    ghosts_ = Kokkos::View<T*, Mem>("shardlib::ghosts", static_cast<std::size_t>(region_offset_.back()));
    // Pieces from each peer in the order that peer sends them (plan order, grouped by peer).
    std::stable_sort(plan_.receives.begin(), plan_.receives.end(), [](const halo::Copy& a, const halo::Copy& b) { return a.src < b.src; });
    const auto n = static_cast<std::size_t>(ctx.num_devices());
    send_regions_.assign(n, coll::Region{});
    recv_regions_.assign(n, coll::Region{});
    // Direct: when each peer gets one piece, in order (no mirror, no repeated edge cell), it goes
    // straight from the block into the peer's ghost region as a strided region (the backends copy
    // or send strided regions themselves); otherwise through packed staging buffers.
    // Staged through host memory: always packed, so that only the ghost cells cross.
    send_direct_ = !staged_ && direct(plan_.sends, true);
    recv_direct_ = !staged_ && direct(plan_.receives, false);
    // The batches of copies (kernels::copy_pieces; sources: 0 the block, 1 the receive buffer;
    // destinations: 0 the send buffer, 1 the ghost regions).
    if (send_direct_) {
      for (const auto& c : plan_.sends) send_regions_[static_cast<std::size_t>(c.dst)] = to_region(block_view(c, false));
    } else {
      std::vector<std::int64_t> offset;
      send_buf_ = Kokkos::View<T*, Mem>("shardlib::ghosts::send", static_cast<std::size_t>(stage(plan_.sends, true, offset, send_regions_)));
      for (std::size_t i = 0; i < plan_.sends.size(); ++i) {
        const auto& c = plan_.sends[i];
        kernels::detail::StridedView packed = box_view(c.src_extent);
        packed.offset = offset[i];
        pack_.add(block_view(c, false), 0, packed, 0);
      }
    }
    if (recv_direct_) {
      for (const auto& c : plan_.receives)
        recv_regions_[static_cast<std::size_t>(c.src)] = to_region(region_view(c.region, c.dst_lo, c.extent));
    } else {
      std::vector<std::int64_t> offset;
      recv_buf_ = Kokkos::View<T*, Mem>("shardlib::ghosts::recv", static_cast<std::size_t>(stage(plan_.receives, false, offset, recv_regions_)));
      for (std::size_t i = 0; i < plan_.receives.size(); ++i) {
        const auto& c = plan_.receives[i];
        kernels::detail::StridedView packed = packed_view(c);
        packed.offset += offset[i];
        unpack_.add(packed, 1, region_view(c.region, c.dst_lo, c.extent), 1);
      }
    }
    for (const auto& c : plan_.local) local_.add(block_view(c, true), 0, region_view(c.region, c.dst_lo, c.extent), 1);
    pack_.upload(ctx);
    unpack_.upload(ctx);
    local_.upload(ctx);
    gathers_.resize(2 * static_cast<std::size_t>(R));
    for (const auto& c : plan_.sends) sent_ += c.src_cells(R);
    for (const auto& c : plan_.receives) received_ += c.cells(R);
    if (staged_) {
      host_send_.resize(send_buf_.size());
      host_recv_.resize(recv_buf_.size());
    }
    // Constant ghost cells never change: filled once.
    for (const auto& f : plan_.fills) {
      auto guard = kernel_guard_for<Mem>(*ctx_, false);
      kernels::fill_strided(exec(), "shardlib::ghosts::fill", static_cast<T>(f.value), ghosts_.data(), region_view(f.region, f.lo, f.extent));
    }
  }

  /// Packs what the neighbours need from `block` and starts the exchange (collective).
  void start(const T* block) {
    if (pending_)
      throw std::logic_error("shardlib: ghosted view of " + describe_ + ": start() while an exchange is in flight; call finish() first");
    pack_.run(*ctx_, "shardlib::ghosts::pack", block, recv_buf_.data(), send_buf_.data(), ghosts_.data());
    if (staged_) {
      download<Mem>(*ctx_, send_buf_.data(), host_send_.data(), static_cast<std::int64_t>(host_send_.size()));
      pending_ = ctx_->world().start_exchange(host_send_.data(), send_regions_, host_recv_.data(), recv_regions_, coll::dtype_of<T>());
    } else {
      pending_ = world().start_exchange(send_direct_ ? block : send_buf_.data(), send_regions_,
                                        recv_direct_ ? ghosts_.data() : recv_buf_.data(), recv_regions_, coll::dtype_of<T>());
    }
    // Copies within this device while the messages travel.
    local_.run(*ctx_, "shardlib::ghosts::local", block, recv_buf_.data(), send_buf_.data(), ghosts_.data());
  }
  /// Completes the exchange: the ghost regions hold the neighbours' cells.
  void finish() {
    if (!pending_) throw std::logic_error("shardlib: ghosted view of " + describe_ + ": finish() without start()");
    auto pending = std::move(pending_);
    pending->wait();
    if (recv_direct_) return;
    if (staged_) upload<Mem>(*ctx_, host_recv_.data(), recv_buf_.data(), static_cast<std::int64_t>(host_recv_.size()));
    unpack_.run(*ctx_, "shardlib::ghosts::unpack", static_cast<const T*>(nullptr), recv_buf_.data(), send_buf_.data(),
                ghosts_.data());
  }
  bool in_flight() const noexcept { return pending_ != nullptr; }

  /// The cell at global index `g` (rank entries), in `block` or the ghost regions.
  T at(const std::int64_t* g, const T* block) const {
    const int R = halo_.rank;
    std::array<int, max_tensor_rank> code{};
    std::array<std::int64_t, max_tensor_rank> q{};
    bool inside = plan_.block.num_elements() > 0;
    for (int d = 0; d < R && inside; ++d) {
      const auto u = static_cast<std::size_t>(d);
      const std::int64_t li = g[u] - plan_.block.offset[u], n = plan_.block.extent[u], w = halo_.width[u];
      inside = li >= -w && li < n + w;
      code[u] = li < 0 ? 0 : li < n ? 1 : 2;
      q[u] = li < 0 ? li + w : li < n ? li : li - n;
    }
    if (!inside) {
      std::string idx, box;
      for (int d = 0; d < R; ++d) {
        const auto u = static_cast<std::size_t>(d);
        idx += (d ? ", " : "") + std::to_string(g[u]);
        box += (d ? ", " : "") + std::to_string(plan_.block.offset[u]) + ":" + std::to_string(plan_.block.offset[u] + plan_.block.extent[u]);
      }
      throw std::out_of_range("shardlib: ghosted view of " + describe_ + ": index (" + idx + ") is outside device " +
                              std::to_string(ctx_->device()) + "'s block [" + box + "] widened by the ghost widths");
    }
    const int r = halo::region_index(code, R);
    const auto e = halo::region_extent(r, R, plan_.block.extent, halo_.width);
    std::int64_t k = 0;
    for (int d = 0; d < R; ++d) k = k * e[static_cast<std::size_t>(d)] + q[static_cast<std::size_t>(d)];
    const T* p = r == halo::centre_region(R) ? block + k : ghosts_.data() + region_offset_[static_cast<std::size_t>(r)] + k;
    if (shardlib::shape_only()) return T{};
    if constexpr (host_memory_v<Mem>) {
      return *p;
    } else {
      T v{};
      download<Mem>(*ctx_, p, &v, 1);  // one cell: a copy and a wait
      return v;
    }
  }

  const T* ghost_data() const noexcept { return ghosts_.data(); }
  const std::int64_t* region_offsets() const noexcept { return region_offset_.data(); }
  /// Scratch in `Mem` for stencil_for's padded copies, of `n` elements at least; kept between
  /// calls. It grows by a new allocation: stencil_for asks once per call, before its kernels,
  /// for the same size each time (the view's shape is fixed).
  T* scratch(std::size_t n) {
    if (scratch_.size() < n) scratch_ = Kokkos::View<T*, Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "shardlib::stencil_for::scratch"), n);
    return scratch_.data();
  }
  /// stencil_for's gather of slab `i` (below 2 * rank) into its padded copy: a batch it fills
  /// the first time, kept with the view (whose geometry is fixed).
  CopyBatch<Mem>& gather_batch(std::size_t i) { return gathers_.at(i); }
  /// stencil_for's record of a read beyond the widths (Check::on): `n` integers in `Mem`, zeroed
  /// (on the device's stream in GPU memory) for the next loop; kept between calls.
  std::int64_t* reset_fault(std::size_t n) {
    if (fault_.size() < n) {
      fault_ = Kokkos::View<std::int64_t*, Mem>("shardlib::stencil_for::fault", n);  // zeroed
    } else if constexpr (host_memory_v<Mem>) {
      std::fill_n(fault_.data(), n, std::int64_t{0});
    } else {
      Kokkos::deep_copy(exec(), fault_, std::int64_t{0});
    }
    return fault_.data();
  }
  const halo::Plan& plan() const noexcept { return plan_; }
  std::int64_t cells_received() const noexcept { return received_; }
  std::int64_t cells_sent() const noexcept { return sent_; }
  const std::string& describe() const noexcept { return describe_; }

 private:
  /// The device's execution space instance for blocks in Mem, and the world their exchange runs on.
  const exec_space_t<Mem>& exec() const noexcept { return ctx_->exec_for<Mem>(); }
  coll::Communicator& world() const {
    if constexpr (host_memory_v<Mem>) return ctx_->world();
    else return *ctx_->device_world();
  }
  /// Whether every peer has one piece at most, walked in order (steps +1) — and in GPU memory,
  /// one contiguous run on this side (a strided one goes through the one packing kernel: the
  /// backends would copy it as a 2-D copy per run of rows, one cell wide for a column).
  bool direct(const std::vector<halo::Copy>& pieces, bool sends) const {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const halo::Copy& c = pieces[i];
      const int p = sends ? c.dst : c.src;
      if (i > 0 && p == (sends ? pieces[i - 1].dst : pieces[i - 1].src)) return false;  // grouped by peer
      for (int d = 0; d < halo_.rank; ++d)
        if (c.step[static_cast<std::size_t>(d)] != 1) return false;
      if constexpr (!host_memory_v<Mem>)
        if (!contiguous(sends ? block_view(c, false) : region_view(c.region, c.dst_lo, c.extent))) return false;
    }
    return true;
  }
  /// Whether a view is one run of consecutive elements.
  static bool contiguous(const kernels::detail::StridedView& v) {
    const kernels::detail::StridedView n = kernels::detail::normalise(v);
    return n.rank == 0 || (n.rank == 1 && n.stride[0] == 1);
  }
  static coll::Region to_region(const kernels::detail::StridedView& v) {
    coll::Region r;
    r.offset = static_cast<std::size_t>(v.offset);
    r.rank = v.rank;
    for (int d = 0; d < v.rank; ++d) {
      r.extent[static_cast<std::size_t>(d)] = static_cast<std::size_t>(v.extent[d]);
      r.stride[static_cast<std::size_t>(d)] = static_cast<std::size_t>(v.stride[d]);
    }
    return r;
  }
  /// Lays the pieces out by peer (each peer's pieces contiguous, in plan order); returns the total.
  std::int64_t stage(const std::vector<halo::Copy>& pieces, bool sends, std::vector<std::int64_t>& offset,
                     std::vector<coll::Region>& regions) const {
    std::int64_t off = 0;
    for (std::size_t i = 0; i < pieces.size();) {
      const int p = sends ? pieces[i].dst : pieces[i].src;
      const std::int64_t first = off;
      for (; i < pieces.size() && (sends ? pieces[i].dst : pieces[i].src) == p; ++i) {
        offset.push_back(off);
        off += pieces[i].src_cells(halo_.rank);
      }
      regions[static_cast<std::size_t>(p)] = coll::Region::contiguous(static_cast<std::size_t>(first), static_cast<std::size_t>(off - first));
    }
    return off;
  }
  /// A row-major box of `extent` (the packed layout).
  kernels::detail::StridedView box_view(const std::array<std::int64_t, max_tensor_rank>& extent) const {
    kernels::detail::StridedView v;
    v.rank = halo_.rank;
    std::int64_t s = 1;
    for (int d = v.rank - 1; d >= 0; --d) {
      v.extent[d] = extent[static_cast<std::size_t>(d)];
      v.stride[d] = s;
      s *= v.extent[d];
    }
    return v;
  }
  /// Copy c's source box in the block: walked in the ghost region's order (`stepped`: mirrors and
  /// repeated edge cells), or as itself in its natural order.
  kernels::detail::StridedView block_view(const halo::Copy& c, bool stepped) const {
    kernels::detail::StridedView v = box_view(plan_.block.extent);
    for (int d = 0; d < v.rank; ++d) v.offset += c.src_lo[static_cast<std::size_t>(d)] * v.stride[d];
    return stepped ? apply_steps(v, c) : with_extent(v, c.src_extent);
  }
  /// The packed source box of receive c, walked in the ghost region's order.
  kernels::detail::StridedView packed_view(const halo::Copy& c) const { return apply_steps(box_view(c.src_extent), c); }
  static kernels::detail::StridedView with_extent(kernels::detail::StridedView v, const std::array<std::int64_t, max_tensor_rank>& e) {
    for (int d = 0; d < v.rank; ++d) v.extent[d] = e[static_cast<std::size_t>(d)];
    return v;
  }
  /// v (the source layout, offset at the source box's first cell) walked as c's ghost box.
  static kernels::detail::StridedView apply_steps(kernels::detail::StridedView v, const halo::Copy& c) {
    for (int d = 0; d < v.rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      if (c.step[u] < 0) {
        v.offset += (c.src_extent[u] - 1) * v.stride[d];
        v.stride[d] = -v.stride[d];
      } else if (c.step[u] == 0) {
        v.stride[d] = 0;
      }
      v.extent[d] = c.extent[u];
    }
    return v;
  }
  /// The box [lo, lo + extent) of ghost region r, in the ghost buffer.
  kernels::detail::StridedView region_view(int r, const std::array<std::int64_t, max_tensor_rank>& lo,
                                           const std::array<std::int64_t, max_tensor_rank>& extent) const {
    kernels::detail::StridedView v = box_view(halo::region_extent(r, halo_.rank, plan_.block.extent, halo_.width));
    v.offset = region_offset_[static_cast<std::size_t>(r)];
    for (int d = 0; d < v.rank; ++d) v.offset += lo[static_cast<std::size_t>(d)] * v.stride[d];
    return with_extent(v, extent);
  }

  Context* ctx_;
  HaloSpec halo_;
  std::string describe_;
  bool staged_;  // device memory with no device world: packed cells go through host memory
  halo::Plan plan_;
  std::vector<std::int64_t> region_offset_;                // 3^R + 1 entries (the centre region is empty here)
  std::vector<coll::Region> send_regions_, recv_regions_;  // per device, in the staging buffers
  Kokkos::View<T*, Mem> ghosts_, send_buf_, recv_buf_, scratch_;
  Kokkos::View<std::int64_t*, Mem> fault_;
  CopyBatch<Mem> pack_, unpack_, local_;  // block -> send buffer, receive buffer -> ghosts, block -> ghosts
  std::vector<CopyBatch<Mem>> gathers_;    // stencil_for's padded copies, one per slab
  std::vector<T> host_send_, host_recv_;  // staged_ only
  std::int64_t received_ = 0, sent_ = 0;
  bool send_direct_ = false, recv_direct_ = false;
  std::unique_ptr<coll::PendingExchange> pending_;
};

}  // namespace detail

/// A view of a DistributedTensor's block with ghost layers (see the file comment). The view
/// refers to the tensor object, which must outlive it; it reads the tensor's block as it is at
/// each exchange (swapping two tensors swaps what two views see). Movable, not copyable.
template <class T, class MeshT, class SpecT, class Mem>
class Ghosted {
 public:
  using tensor_type = DistributedTensor<T, MeshT, SpecT, Mem>;
  static constexpr std::size_t rank = tensor_type::rank;
  static_assert(rank >= 1, "shardlib: ghosted: a rank-0 tensor has no neighbours");

  /// Plans the exchange for this device and fills the constant ghost cells. Not collective.
  /// Throws std::invalid_argument for a bad width or boundary, naming the dim and the tensor.
  Ghosted(const tensor_type& t, const Ghosts<rank>& g)
      : t_(&t), ghosts_(g), shape_(t.shape()),
        x_(t.context(), tensor_type::sharding, t.mesh().shape(), shape_, g.spec(), describe(t, g)) {
    SHARDLIB_STATIC_REQUIRE((!tensor_type::sharding.is_partial()),
                            "shardlib: ghosted view of a partial tensor: its blocks hold addends, not cells; reshard it first",
                            error::a_partial_tensor_has_no_cells_to_exchange_reshard_it_first<SpecT>);
  }

  /// Refreshes every ghost cell from the tensor's current blocks. Collective.
  void exchange() {
    start();
    finish();
  }
  /// Starts the exchange: packs what the neighbours need and sends it (collective). Until
  /// finish(), the tensor's block must not change and the ghost cells are not to be read.
  void start() {
    check_shape();
    x_.start(t_->local().data());
  }
  /// Completes the exchange started by start(): the ghost cells hold the neighbours' cells.
  void finish() { x_.finish(); }
  /// Whether start() was called and finish() not yet.
  bool in_flight() const noexcept { return x_.in_flight(); }

  const tensor_type& tensor() const noexcept { return *t_; }
  const Ghosts<rank>& ghosts() const noexcept { return ghosts_; }
  int width(std::size_t d) const { return ghosts_.width.at(d); }
  /// Ghost cells this device receives from other devices per exchange: the lower bound of what
  /// must travel to it, and what does.
  std::int64_t cells_received() const noexcept { return x_.cells_received(); }
  /// Cells it sends (the neighbours' ghost cells it holds; an edge boundary sends its cell once).
  std::int64_t cells_sent() const noexcept { return x_.cells_sent(); }

  /// The cell at `global`, in this device's block or its ghost layers (current after an
  /// exchange); in GPU memory a copy of one cell and a wait (for tests, not loops); zero in
  /// shape-only mode. Throws std::out_of_range naming the index and the widened block otherwise.
  T at(const Index<rank>& global) const {
    check_shape();
    return x_.at(global.i, t_->local().data());
  }
  /// Throws std::invalid_argument when the tensor no longer has the shape the view was made for
  /// (a new tensor assigned to it): the view's ghost regions and plan are for the old blocks.
  void check_shape() const {
    if (t_->shape() != shape_)
      throw std::invalid_argument("shardlib: ghosted view of " + x_.describe() + ": the tensor now has shape " +
                                  detail::shape_text(t_->shape()) + "; make a new view for the new shape");
  }

  /// Internal (stencil_for): the ghost regions' storage (in Mem) and where each region starts in it.
  const T* ghost_data() const noexcept { return x_.ghost_data(); }
  const std::int64_t* region_offsets() const noexcept { return x_.region_offsets(); }
  T* scratch(std::size_t n) { return x_.scratch(n); }
  std::int64_t* reset_fault(std::size_t n) { return x_.reset_fault(n); }
  detail::CopyBatch<Mem>& gather_batch(std::size_t i) { return x_.gather_batch(i); }
  /// "a tensor of shape [8, 8] with Spec<x, y> on mesh {x: 2, y: 2}, ghost widths (1, 1)".
  const std::string& describe() const noexcept { return x_.describe(); }

 private:
  static std::string describe(const tensor_type& t, const Ghosts<rank>& g) {
    std::string w;
    for (std::size_t d = 0; d < rank; ++d) w += (d ? ", " : "") + std::to_string(g.width[d]);
    return "a tensor of shape " + detail::shape_text(t.shape()) + " with " + tensor_type::spec_string() + " on mesh " +
           t.mesh().to_string() + ", ghost widths (" + w + ")";
  }
  const tensor_type* t_;
  Ghosts<rank> ghosts_;
  typename tensor_type::Shape shape_;
  detail::GhostExchange<T, Mem> x_;
};

/// `t` with `width[d]` ghost layers on both sides of dim d; ghost cells beyond the global
/// domain hold zeros.
template <class T, class MeshT, class SpecT, class Mem>
Ghosted<T, MeshT, SpecT, Mem> ghosted(const DistributedTensor<T, MeshT, SpecT, Mem>& t,
                                      const std::array<int, SpecT::rank>& width) {
  return Ghosted<T, MeshT, SpecT, Mem>(t, Ghosts<SpecT::rank>{width, {}});
}
/// ... with `boundary` on both sides of every dim that has ghost layers.
template <class T, class MeshT, class SpecT, class Mem>
Ghosted<T, MeshT, SpecT, Mem> ghosted(const DistributedTensor<T, MeshT, SpecT, Mem>& t,
                                      const std::array<int, SpecT::rank>& width, Boundary boundary) {
  Ghosts<SpecT::rank> g{width, {}};
  for (std::size_t d = 0; d < SpecT::rank; ++d)
    if (width[d] > 0) g.boundary[d] = {boundary, boundary};
  return Ghosted<T, MeshT, SpecT, Mem>(t, g);
}
/// ... with a boundary per dim and side: `{{low0, high0}, {low1, high1}, ...}`.
template <class T, class MeshT, class SpecT, class Mem>
Ghosted<T, MeshT, SpecT, Mem> ghosted(const DistributedTensor<T, MeshT, SpecT, Mem>& t,
                                      const std::array<int, SpecT::rank>& width,
                                      const std::array<std::array<Boundary, 2>, SpecT::rank>& boundary) {
  return Ghosted<T, MeshT, SpecT, Mem>(t, Ghosts<SpecT::rank>{width, boundary});
}

}  // namespace shardlib
