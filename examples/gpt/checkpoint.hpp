// SPDX-License-Identifier: Apache-2.0
// Checkpoints of the gpt example's runs (needs HDF5: <shardlib/io.hpp>): the parameters, AdamW's
// moments (and the float32 master weights of 16-bit parameters), and the step count, in one
// file, `DIR/gpt.h5`, under names that do not depend on the recipe:
//   model/wte, model/layer0/wq, ...              the parameters
//   adamw/layer0/wq/m0, .../m1, .../master      the optimizer's state of each
//   train/step                                   the steps taken ([1], int64)
//   train/loss_scaler                            f16: the LossScaler's state ([3], float64:
//                                                scale, good steps in a row, steps skipped)
// A pipelined run's stages each list their own tensors (io::save takes them so): the file is
// the same as a run without stages would write.
// A run saved with one recipe on one mesh resumes with any recipe on any mesh (io::load lays
// each tensor out in the spec it is loaded into), and continues the same loss curve: its next
// batch is the one the saved run would have drawn.
#pragma once

#include <shardlib/io.hpp>

#include "gpt.hpp"

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

/// The file of a run's checkpoint in directory `dir`.
inline std::string checkpoint_file(const std::string& dir) { return (std::filesystem::path(dir) / "gpt.h5").string(); }

namespace detail {
/// The checkpoint's name of moment `i` of a parameter's optimizer state, and of its master weights.
inline std::string moment_name(const std::string& param, std::size_t i) {
  return "adamw/" + param + "/m" + std::to_string(i);
}
inline std::string master_name(const std::string& param) { return "adamw/" + param + "/master"; }

/// What save_run and load_run do with each tensor of a checkpoint: one visitor type for the three
/// walks (save, load, tag), so that the walk over a model's tensors is compiled once per recipe,
/// not once per walk (it was a tenth of the 16-bit recipes' code).
struct CheckpointVisit {
  enum class Do { save, load, tag } what;
  std::vector<sl::io::Entry>* entries = nullptr;
  std::vector<sl::io::Target>* targets = nullptr;
  template <class Tensor>
  void operator()(const std::string& name, Tensor& t) const {
    const bool param = name.rfind("model/", 0) == 0;
    switch (what) {
      case Do::save: entries->emplace_back(name, t); break;
      // A parameter's block is viewed by the optimizer too (it holds a copy of the Param): its
      // values are loaded in place. The optimizer's state tensors are its own: assigned new blocks.
      case Do::load:
        if (param) targets->emplace_back(name, t, sl::io::in_place);
        else targets->emplace_back(name, t);
        break;
      // The state's loaded blocks were allocated under the default role: count them as what they are.
      case Do::tag:
        if (!param) sl::tag_memory(t, sl::MemoryRole::optimizer_state);
        break;
    }
  }
};

/// visit(name, tensor) for every tensor of the checkpoint this device's model and optimizer hold.
template <class R, class E>
void for_each_checkpoint_tensor(Model<R, E>& model, sl::optim::AdamW& opt, const CheckpointVisit& visit) {
  model.for_each_named_param([&](const std::string& name, auto& p) {
    using Tensor = typename std::remove_cvref_t<decltype(p)>::tensor_type;
    visit("model/" + name, p.value());
    auto state = [&](auto st) {
      for (std::size_t i = 0; i < st.moments.size(); ++i) visit(moment_name(name, i), st.moments[i]);
      if (st.master) visit(master_name(name), *st.master);
    };
    if constexpr (R::zero == Zero::none)
      state(opt.template state<typename Tensor::spec_type>(p));
    else
      state(opt.template state<typename sl::optim::zero_spec_t<Tensor, "data">>(p));
  });
}
}  // namespace detail

/// Saves the run (collective) after `steps` steps into `dir` (created if missing), replacing its
/// previous checkpoint atomically (io::save: complete or absent). `scaler`: f16's, saved with it.
template <class R, class E>
void save_run(const std::string& dir, Model<R, E>& model, sl::optim::AdamW& opt, std::int64_t steps,
              const sl::optim::LossScaler& scaler) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);  // (every device; an error shows in the save)
  using Step = sl::DistributedTensor<std::int64_t, typename R::Mesh, Spec<none>>;
  using ScalerState = sl::DistributedTensor<double, typename R::Mesh, Spec<none>>;
  const Step step = Step::full(model.mesh, {1}, steps);
  const auto st = scaler.state();
  const ScalerState scaling =
      ScalerState::from_host(model.mesh, {3}, std::vector<double>{st.scale, double(st.good), double(st.skipped)});
  std::vector<sl::io::Entry> entries;
  detail::for_each_checkpoint_tensor(model, opt, {detail::CheckpointVisit::Do::save, &entries});
  entries.emplace_back("train/step", step);
  if constexpr (std::is_same_v<E, sl::f16>) entries.emplace_back("train/loss_scaler", scaling);
  sl::io::save(checkpoint_file(dir), entries);
}

/// Loads a run saved by save_run (any recipe, any mesh, with or without stages) into `model` and
/// `opt` (and, f16, `scaler`, when the checkpoint has its state: one from a bf16 or float32 run
/// starts a fresh scale), and returns the steps it had taken (`opt`'s count set to it).
/// Collective. Throws what io::load throws (a missing file, a tensor of another shape or element
/// type, naming it and both shapes), with the model and the optimizer unchanged.
template <class R, class E>
std::int64_t load_run(const std::string& dir, Model<R, E>& model, sl::optim::AdamW& opt, sl::optim::LossScaler& scaler) {
  const std::string file = checkpoint_file(dir);
  using Step = sl::DistributedTensor<std::int64_t, typename R::Mesh, Spec<none>>;
  const std::int64_t steps = sl::io::load<Step>(model.mesh, file, "train/step").to_host()[0];
  std::vector<sl::io::Target> targets;
  detail::for_each_checkpoint_tensor(model, opt, {detail::CheckpointVisit::Do::load, nullptr, &targets});
  sl::io::load(file, targets);  // all or nothing
  detail::for_each_checkpoint_tensor(model, opt, {detail::CheckpointVisit::Do::tag});
  opt.set_steps(steps);
  if constexpr (std::is_same_v<E, sl::f16>) {
    bool saved = false;
    for (const auto& info : sl::io::list(file)) saved = saved || info.name == "train/loss_scaler";
    if (saved) {
      using ScalerState = sl::DistributedTensor<double, typename R::Mesh, Spec<none>>;
      const auto v = sl::io::load<ScalerState>(model.mesh, file, "train/loss_scaler").to_host();
      scaler.set_state({v[0], static_cast<std::int64_t>(v[1]), static_cast<std::int64_t>(v[2])});
    }
  }
  return steps;
}

/// train()'s hooks that resume from `resume` (when not empty), save into `save` every `every`
/// steps and after the last, and call `end(model)` at the end.
template <class End>
struct CheckpointHooks {
  std::string resume, save;
  int every = 0, steps = 0;
  End end_fn;
  int started = 0;
  template <class R, class E>
  int start(Model<R, E>& model, sl::optim::AdamW& opt, sl::optim::LossScaler& scaler) {
    if (resume.empty()) return 0;
    started = static_cast<int>(load_run(resume, model, opt, scaler));
    return started;
  }
  template <class R, class E>
  void after_step(int s, Model<R, E>& model, sl::optim::AdamW& opt, const sl::optim::LossScaler& scaler) {
    if (!save.empty() && ((every > 0 && (s + 1) % every == 0) || s + 1 == steps)) save_run(save, model, opt, s + 1, scaler);
  }
  template <class M>
  void end(M& model) {
    end_fn(model);
  }
};

}  // namespace gpt
