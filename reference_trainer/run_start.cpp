// reference_trainer/run_start.cpp: a rank's inputs before any work: the data, the
// shape, the checkpoint folder and its checkpoints (this rank's, verified; another
// layout or another run's refused), its report for the start agreement, and the step
// every rank resumes from.
#include "run.hpp"

#include "checkpoint_folder.hpp"
#include "run_agreement.hpp"
#include "run_fingerprint.hpp"
#include "stop_signals.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace dilocox::trainer {

namespace fs = std::filesystem;

// This rank's report for the start agreement: every check of its own inputs, with
// what failed caught and described (never throws).
json Run::check_inputs() {
  json r{{"parsed", true}, {"code", 0}, {"where", where()}};
  r["flags"] = flag_values(o_, /*outcome_only=*/false);
  if (o_.plan) return r;
  try {
    check_inputs_or_throw();
    r["flags"]["data"] = data_fingerprint_;
    r["checkpoint"] = {{"files", !own_steps_.empty()}, {"intact", intact_steps_}, {"removed_tmp", removed_tmp_}};
  } catch (const UsageError& e) {
    r["code"] = 2;
    r["message"] = e.what();
  } catch (const std::exception& e) {
    r["code"] = 1;
    r["message"] = e.what();
  }
  return r;
}

// After a go verdict: the step every rank resumes from (0: start), or the reason none
// can (the same on every rank). Throws UsageError/dilocox::Error.
std::int64_t Run::agreed_start(const std::vector<json>& reports) {
  bool any_files = false;
  int removed = 0;
  std::vector<std::int64_t> common;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto& c = reports[r].at("checkpoint");
    any_files = any_files || c.at("files").get<bool>();
    removed += c.at("removed_tmp").get<int>();
    const auto steps = c.at("intact").get<std::vector<std::int64_t>>();
    if (r == 0) common = steps;
    std::erase_if(common, [&](std::int64_t s) { return std::find(steps.begin(), steps.end(), s) == steps.end(); });
  }
  if (removed > 0 && world_.speaks())
    std::fprintf(stderr, "dilocox-train: removed %d temporary file(s) of a save cut short in %s\n", removed,
                 o_.checkpoint_dir.c_str());
  if (!o_.resume) return 0;
  if (!any_files) {
    if (!o_.resume_if_present)
      throw UsageError("--resume: no checkpoint in " + o_.checkpoint_dir +
                       " to resume (a wrong folder, or one not mounted here?); --resume-if-present starts at step 0 "
                       "when there is none");
    if (world_.speaks())
      std::fprintf(stderr, "dilocox-train: no checkpoint in %s, starting at step 0 (--resume-if-present)\n",
                   o_.checkpoint_dir.c_str());
    return 0;
  }
  if (!common.empty()) return *std::max_element(common.begin(), common.end());
  // A rank with no checkpoint file at all, and none refused anywhere: no step was ever
  // saved by every rank (the first save was cut short, the other ranks' files of it
  // are all there is), so there is nothing to lose by starting over.
  bool some_never_saved = false, some_refused = false;
  for (const auto& rep : reports) {
    const auto& c = rep.at("checkpoint");
    const bool files = c.at("files").get<bool>(), intact = !c.at("intact").empty();
    some_never_saved = some_never_saved || !files;
    some_refused = some_refused || (files && !intact);
  }
  std::string who;
  for (std::size_t r = 0; r < reports.size(); ++r) {
    const auto steps = reports[r].at("checkpoint").at("intact").get<std::vector<std::int64_t>>();
    std::string list;
    for (auto s : steps) list += (list.empty() ? "" : ", ") + std::to_string(s);
    who += (who.empty() ? "" : "; ") + detail::who(reports, static_cast<int>(r)) + ": " +
           (steps.empty() ? (reports[r]["checkpoint"]["files"].get<bool>() ? "all refused" : "none") : "steps " + list);
  }
  if (some_never_saved && !some_refused) {
    if (world_.speaks())
      std::fprintf(stderr, "dilocox-train: no step saved by every rank in %s (%s): the first save was cut short, "
                   "starting at step 0\n", o_.checkpoint_dir.c_str(), who.c_str());
    return 0;
  }
  throw dilocox::Error("no intact checkpoint for every rank in " + o_.checkpoint_dir + " at a common step (" + who + ")");
}

std::string Run::where() const {
  return world_size_ == 1 ? "" : layout_.where(rank_);
}

void Run::check_inputs_or_throw() {
  const fs::path data(o_.data_dir);
  for (const char* f : {"train.bin", "val.bin"})
    if (!fs::exists(data / f))
      throw UsageError((data / f).string() + " not found: run scripts/prepare_data.sh (or pass --data-dir)");
  try {
    train_data_ = read_token_shard((data / "train.bin").string());
    val_data_ = read_token_shard((data / "val.bin").string());
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  char fp[80];
  std::snprintf(fp, sizeof fp, "train %016llx, val %016llx",
                static_cast<unsigned long long>(dilocox::checksum64(std::as_bytes(std::span(train_data_.tokens)))),
                static_cast<unsigned long long>(dilocox::checksum64(std::as_bytes(std::span(val_data_.tokens)))));
  data_fingerprint_ = fp;
  shape_ = resolve_shape(o_, std::max(train_data_.vocab, val_data_.vocab), world_size_);
  sync_opts_ = resolve_sync(o_);
  step_tokens_ = shape_.tokens_per_step() * o_.clusters;  // all clusters together
  total_steps_ = (o_.tokens + step_tokens_ - 1) / step_tokens_;
  fault_ = parse_fault(o_.inject_nan, o_.clusters, total_steps_);
  try {
    train_sampler_.emplace(train_data_, shape_.seq_len, o_.seed, /*stream=*/replica_);
    val_sampler_.emplace(val_data_, shape_.seq_len, o_.seed, 0);
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  if (!o_.dump_pseudo_gradients.empty()) {
    if (o_.clusters == 1 || sync_mode(o_.sync).per_step)
      throw UsageError("--dump-pseudo-gradients needs --clusters > 1 and an outer-loop --sync");
    if (o_.fragments != 1) throw UsageError("--dump-pseudo-gradients needs --fragments 1");
    if (o_.dp != 1) throw UsageError("--dump-pseudo-gradients needs --dp 1");
  }
  prefix_ = layout_.file_prefix(rank_);
  if (rank_ == 0 && !o_.metrics.empty() && !std::ofstream(o_.metrics, std::ios::app))
    throw UsageError("cannot write --metrics " + o_.metrics);
  if (!o_.checkpoint_dir.empty()) check_checkpoints();
}

// The folder takes a test write under the longest name the run will write; this run
// locks it (rank 0 the folder, every rank its own files); stale temporaries go; a
// fresh run refuses a folder that holds checkpoints; --resume verifies this rank's
// files, newest first, and refuses another layout or a checkpoint whose outcome flags
// differ from this run's.
void Run::check_checkpoints() {
  const fs::path dir(o_.checkpoint_dir);
  if (o_.resume && !o_.resume_if_present && !fs::is_directory(dir))
    throw UsageError("--resume: " + o_.checkpoint_dir + " does not exist here (a wrong folder, or one not mounted "
                     "here?); --resume-if-present starts at step 0 when there is no checkpoint");
  try {
    probe_checkpoint_dir(dir, prefix_, longest_checkpoint_name(prefix_, total_steps_));
    if (rank_ == 0) folder_lock_ = FolderLock(dir, "dilocox.lock");
    rank_lock_ = FolderLock(dir, prefix_ + ".lock");
  } catch (const dilocox::Error& e) {
    throw UsageError(e.what());
  }
  removed_tmp_ = remove_stale_temporaries(dir, prefix_);
  own_steps_ = list_checkpoints(dir, prefix_);
  const auto layouts = checkpoint_layouts(dir);
  std::string others;
  for (const auto& p : layouts)
    if (RankLayout::of_prefix(p) != RankLayout::of_prefix(prefix_)) others = RankLayout::of_prefix(p) + " (" + p + "-step*.ckpt)";
  if (!o_.resume && !layouts.empty())
    throw UsageError("--checkpoint-dir " + o_.checkpoint_dir + " already holds checkpoints (" +
                     (own_steps_.empty() ? "of " + others : "this run's, newest step " + std::to_string(own_steps_[0])) +
                     "): pass --resume to continue that run, or choose another folder");
  if (!o_.resume) return;
  if (own_steps_.empty() && !others.empty())
    throw UsageError("--resume: " + o_.checkpoint_dir + " holds checkpoints of " + others + ", not of this run's " +
                     RankLayout::of_prefix(prefix_) + ": resume with that layout, or start in another folder");
  for (auto s : own_steps_) {
    const auto path = checkpoint_path(dir, prefix_, s);
    try {
      auto c = Checkpoint::read(path);
      if (!loaded_) {
        check_resumable(c, s);
        loaded_ = std::move(c);
        loaded_step_ = s;
      }
      intact_steps_.push_back(s);
    } catch (const dilocox::Error& e) {
      std::fprintf(stderr, "dilocox-train: %s%s; trying an older one\n",
                   world_size_ > 1 ? (layout_.describe(rank_) + ": ").c_str() : "", e.what());
    }
  }
}

// Throws UsageError naming every outcome flag whose value differs from the checkpoint's
// (the same words on every rank, so a refusal prints once).
void Run::check_resumable(const Checkpoint& c, std::int64_t step) {
  const json saved = json::parse(c.get_text("meta"));
  const json now = run_meta(0, false, 0);
  const std::string differ = saved.contains("flags") ? describe_resume_mismatches(saved["flags"], now["flags"])
                                                     : legacy_mismatch(saved, now);
  if (!differ.empty())
    throw UsageError("--resume: the checkpoint at step " + std::to_string(step) + " in " + o_.checkpoint_dir +
                     " is from a run with other flags that change the outcome: " + differ +
                     " (pass the checkpoint's values, or start in another folder)");
}

json Run::run_meta(std::int64_t step, bool finished, double final_eval) const {
  json flags = flag_values(o_, /*outcome_only=*/true);
  flags["data"] = data_fingerprint_;
  json m{{"step", step},
         {"total_steps", total_steps_},
         {"model",
          {{"layers", shape_.model.n_layer},
           {"embd", shape_.model.n_embd},
           {"heads", shape_.model.n_head},
           {"vocab", shape_.model.vocab},
           {"max_seq", shape_.model.max_seq},
           {"ffn", shape_.model.ffn_hidden()}}},
         {"stages", shape_.stages},
         {"clusters", o_.clusters},
         {"sync", o_.clusters > 1 ? o_.sync : "none"},
         {"batch", shape_.batch},
         {"micro_batches", shape_.micro_batches},
         {"seq_len", shape_.seq_len},
         {"seed", o_.seed},
         {"flags", flags},
         {"finished", finished}};
  if (finished) m["final_eval_loss"] = final_eval;
  return m;
}

}  // namespace dilocox::trainer
