// reference_trainer/stop_signals.hpp: how a run is asked to stop. SIGINT, SIGTERM, SIGHUP
// (unless ignored, as under nohup) and SIGUSR1 only set a flag; the ranks agree on it
// after every step (one small allreduce) and save a checkpoint at once. SIGUSR1 is the
// signal Open MPI's mpirun forwards to the ranks without ending the job (its
// ess_base_forward_signals default): `kill -USR1 <mpirun>` stops a run cleanly with exit
// 0. SIGTERM or Ctrl-C to mpirun (Open MPI 4.1, measured): the ranks get SIGCONT at once,
// SIGTERM odls_base_sigkill_timeout seconds later (default 1) and SIGKILL as long after
// that, and mpirun exits 1 whatever the ranks did; launcher_kill_grace() reads it.
// Not here: the agreement itself and the save (train_main.cpp).
#pragma once

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <string>

namespace dilocox::trainer {

inline std::atomic<int> g_stop_signal{0};  // the last stop signal received, 0: none

inline void on_stop_signal(int sig) { g_stop_signal.store(sig); }

inline void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking calls (MPI, file writes) carry on; the flag is read between steps
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
  struct sigaction old {};
  sigaction(SIGHUP, nullptr, &old);
  if (old.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, nullptr);
}

inline int pending_stop_signal() { return g_stop_signal.load(); }

inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}

// Seconds between the SIGTERM and the SIGKILL mpirun sends the ranks when it is itself
// told to stop (odls_base_sigkill_timeout, set with `mpirun --mca odls_base_sigkill_timeout
// N` or OMPI_MCA_odls_base_sigkill_timeout in mpirun's environment, which reach the
// ranks' environment too); 0 when not started by Open MPI's mpirun.
inline double launcher_kill_grace() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return 0;
  const char* v = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  if (!v) return 1;
  char* end = nullptr;
  const double g = std::strtod(v, &end);
  return end != v && g > 0 ? g : 1;
}

}  // namespace dilocox::trainer
