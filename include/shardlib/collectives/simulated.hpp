// SPDX-License-Identifier: Apache-2.0
/// @file
/// A simulated group: one device of a group of any size (up to 65,536 devices) in this process,
/// whose collectives are counted and never performed.
///
/// The `simulate` backend (runtime.hpp, `--backend simulate --devices N`) runs the program as one
/// device of a mesh that need not exist: its world and every group it splits are
/// `SimulatedCommunicator`s with the size and rank the real run's would have, and every call
/// runs as in a dry run (collectives/counters.hpp): checked and counted with the same bytes as
/// the real collective, the receive buffer left with this device's own part (or, in a
/// shape-only block, untouched). Nothing waits for another device, since none runs.
///
/// What a simulated device cannot know is what the others would send it: a branch on a value
/// that came from a collective takes the dry run's branch.
#pragma once

#include <shardlib/collectives/communicator.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace shardlib::coll {

/// The most devices a simulated group may have.
inline constexpr int max_simulated_devices = 65536;

/// One device of a simulated group (see the file comment).
class SimulatedCommunicator final : public Communicator {
 public:
  /// Device `rank` of a simulated world of `size` devices. Throws std::invalid_argument when
  /// `size` is outside 1..max_simulated_devices or `rank` outside the group.
  static std::unique_ptr<SimulatedCommunicator> world(int size, int rank) {
    if (size < 1 || size > max_simulated_devices)
      throw std::invalid_argument("shardlib: a simulated mesh has 1 to " + std::to_string(max_simulated_devices) +
                                  " devices, not " + std::to_string(size));
    if (rank < 0 || rank >= size)
      throw std::invalid_argument("shardlib: simulated device " + std::to_string(rank) + " is not one of the " +
                                  std::to_string(size) + " devices (0 to " + std::to_string(size - 1) + ")");
    return std::unique_ptr<SimulatedCommunicator>(new SimulatedCommunicator(rank, size, "world"));
  }

  std::string_view backend() const noexcept override { return "simulate"; }
  bool buffered_sends() const noexcept override { return true; }

 protected:
  // A simulated device runs every collective as a dry run (runtime.hpp's simulate backend keeps
  // coll::DryRun alive on its thread), so the data-moving calls are never reached; were one
  // reached (a DryRun scope ended inside the run), it says so rather than move nothing silently.
  [[noreturn]] void moved(const char* what) const {
    throw std::logic_error(std::string("shardlib: ") + what + " on a simulated device (" + name() +
                           ") outside a dry run: a simulated device cannot move data");
  }
  void do_all_gather(const void*, void*, const Blocks&, DType) override { moved("all_gather"); }
  void do_reduce_scatter(const void*, void*, const Blocks&, DType, Op) override { moved("reduce_scatter"); }
  void do_all_reduce(const void*, void*, std::size_t, DType, Op) override { moved("all_reduce"); }
  void do_all_to_all(const void*, const Blocks&, void*, const Blocks&, DType) override { moved("all_to_all"); }
  void do_exchange(const void*, std::span<const Region>, void*, std::span<const Region>, DType) override {
    moved("exchange");
  }
  void do_broadcast(void*, std::size_t, DType, int) override { moved("broadcast"); }
  void do_send(const void*, std::size_t, DType, int, int) override { moved("send"); }
  void do_recv(void*, std::size_t, DType, int, int) override { moved("recv"); }
  void do_permute(const void*, std::size_t, int, void*, std::size_t, int, DType) override { moved("permute"); }
  void do_barrier() override { moved("barrier"); }
  /// Without the group's size the others would have to be asked: only sized splits (mesh
  /// groups, Context::group) work on a simulated device.
  std::unique_ptr<Communicator> do_split(int, int, std::string name) override {
    throw std::logic_error("shardlib: split of a simulated group (" + this->name() + ") into '" + name +
                           "' without its size: a simulated device cannot ask the others; split by mesh axes "
                           "(Context::group) instead");
  }
  std::unique_ptr<Communicator> do_split_sized(int color, int key, int group_size, std::string name) override {
    if (color < 0) return nullptr;
    if (group_size < 1 || group_size > size() || key < 0 || key >= group_size)
      throw std::invalid_argument("shardlib: simulated split '" + name + "': rank " + std::to_string(key) +
                                  " in a group of " + std::to_string(group_size) + " out of " + std::to_string(size()) +
                                  " devices");
    return std::unique_ptr<Communicator>(new SimulatedCommunicator(key, group_size, std::move(name)));
  }

 private:
  SimulatedCommunicator(int rank, int size, std::string name) : Communicator(rank, size, std::move(name)) {}
};

}  // namespace shardlib::coll
