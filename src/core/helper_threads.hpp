#pragma once
// Threads of the parallel loops outside the kernels (the inputs' finite scan, a fingerprint, a
// large tensor's page fill, a fit's heads, the hybrid driver's row loops):
// the backend's load-aware team rules (src/cpu/team.hpp, which defines these), without a facade
// or src/core including the backend.
namespace favor::detail {

/// The threads for such a loop: favor::num_threads(), or 1 while the machine is contended. These
/// loops are short passes over memory and are not judged; after one, call team_ran(team).
int helper_team();

/// A loop outside the kernels has just run on `team` threads: with more than one the team is
/// awake now, and the next kernel region is not an isolated call after a pause. With one:
/// nothing (a scan run alone does not make the kernel after it a call back to back).
void team_ran(int team);

}  // namespace favor::detail
