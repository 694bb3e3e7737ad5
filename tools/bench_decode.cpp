// favor bench's decode section: the Decoder's steps after a prefill of each
// --decode-positions tokens, and the batched decode of issue 27:
//   decode       append(k, v) + query(q), one sequence of --bh heads, at each position;
//   dec_split    append + query of B sequences x --bh heads (each --decode-batch B), and
//   dec_step     Decoder::step, the fused step, on the same decoder state: the same run's
//                baseline and its replacement; both at 1 thread and at all threads;
//   state_rw     one read and write of those B x --bh states (no arithmetic to speak of):
//                the memory floor of a step, the same run's ceiling for dec_step;
//   vq_split, vq_step  the same for VQDecoder (hard VQ, --vq-codes codes);
//   prefill      Decoder::prefill of a --decode-prompt prompt, against
//   causal+app   causal favor_attention of the prompt then append (what a model did before);
//   vq_prefill, vq_causal+app  the same for VQDecoder.
// tokens/s counts positions of one sequence (all heads): B per step. The step rows also
// time single steps (JSON best_tokens_per_s, p10_tokens_per_s: the fastest and the 10th
// percentile of up to 400), which a machine shared with other work (a preempted OpenMP thread
// stalls a whole step) leaves closer to the code's own speed than the median.
#include <algorithm>
#include <chrono>
#include <vector>

#include "bench_runner.hpp"

namespace favor::cli {
namespace {

DecoderOptions decoder_options(BenchRunner& bench) {
  DecoderOptions options;
  options.kernel = bench.kernel();
  if (data_adapted(options.kernel)) {  // a fit from calibration rows (the decoder needs one)
    const auto calibration = bench.inputs(bench.args().bh, 256, 5000);
    options.fit = fit_kernel(options.kernel, std::get<0>(calibration), std::get<1>(calibration));
  }
  return options;
}

Projection bench_projection(const BenchArgs& a) {
  return Projection::draw(a.m, a.d, {ProjectionKind::orthogonal, NormMode::chi, 0});
}

// [B, H, T, D] view of a bench input [1, B*H, T, D].
TensorView as_batch(const Tensor& t, int64_t batch, int64_t heads, int64_t first, int64_t count) {
  const Shape4 s = t.shape();
  return TensorView{t.data() + first * s[3],
                    {batch, heads, count, s[3]},
                    {heads * s[2] * s[3], s[2] * s[3], s[3], 1}};
}

// Appends `position` tokens to every row of dec in chunks.
void fill(BenchRunner& bench, Decoder& dec, int64_t position) {
  const int64_t heads = dec.batch() * dec.heads(), chunk = std::max<int64_t>(1, 65536 / heads);
  for (int64_t done = 0; done < position; done += chunk) {
    const int64_t t = std::min(chunk, position - done);
    const auto qkv = bench.inputs(heads, t, 7000 + done);
    dec.append(as_batch(std::get<1>(qkv), dec.batch(), dec.heads(), 0, t),
               as_batch(std::get<2>(qkv), dec.batch(), dec.heads(), 0, t));
  }
}

// The fastest and the 10th-percentile time of single calls of step: 400 of them, or fewer
// (at least 20) once max_s seconds have passed.
template <class Step>
std::pair<double, double> single_steps(Step step, double max_s) {
  std::vector<double> ts;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 400; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    const auto t1 = std::chrono::steady_clock::now();
    ts.push_back(std::chrono::duration<double>(t1 - t0).count());
    if (r >= 20 && std::chrono::duration<double>(t1 - start).count() > max_s) break;
  }
  std::sort(ts.begin(), ts.end());
  return {ts.front(), ts[ts.size() / 10]};
}

void emit_step(BenchRunner& bench, const char* method, int64_t position, int64_t batch, int threads,
               const Measured& t, int64_t steps, std::pair<double, double> single,
               double flops_per_step = 0.0) {
  const int64_t bh = batch * bench.args().bh;
  const double per_step = t.seconds / double(steps);
  if (flops_per_step == 0.0) flops_per_step = favor::bench::decode_step_flops(bench.problem(bh, 1));
  bench.emit({{"method", method},
              {"causal", true},
              {"n", position},
              {"bh", bh},
              {"batch", batch},
              {"threads", threads},
              {"seconds", per_step},
              {"gflops", flops_per_step / per_step / 1e9},
              {"tokens_per_s", double(batch) / per_step},
              {"best_tokens_per_s", double(batch) / single.first},
              {"p10_tokens_per_s", double(batch) / single.second},
              {"peak_heap_mb", t.heap_mb},
              {"rss_growth_mb", t.rss_mb}});
}

// Times `steps` decode steps of dec (a Decoder or a VQDecoder of B sequences x --bh heads),
// each on the next token of `steps` fixed ones: the fused step or append + query. Returns
// the timed loop and the fastest and 10th-percentile single steps.
template <class Dec>
std::pair<Measured, std::pair<double, double>> time_steps(BenchRunner& bench, Dec& dec,
                                                          int64_t batch, bool fused,
                                                          int64_t steps) {
  const BenchArgs& a = bench.args();
  const int64_t heads = a.bh;
  const auto qkv = bench.inputs(batch * heads, steps, 99);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor y({batch, heads, 1, a.d});
  int64_t i = 0;
  const auto step = [&] {
    const int64_t t = i++ % steps;
    const TensorView qt = as_batch(q, batch, heads, t, 1), kt = as_batch(k, batch, heads, t, 1),
                     vt = as_batch(v, batch, heads, t, 1);
    if (fused) {
      dec.step(qt, kt, vt, y.mutable_view());
    } else {
      dec.append(kt, vt);
      dec.query(qt, y.mutable_view());
    }
  };
  const Measured t = measure(
      [&] {
        for (int64_t s = 0; s < steps; ++s) step();
      },
      a.repeats, a.min_time);
  return {t, single_steps(step, std::max(0.05, a.min_time))};
}

// Prefill `position` tokens, then time steps of B sequences: fused (step) or append + query.
void step_row(BenchRunner& bench, int64_t position, int64_t batch, bool fused, bool legacy,
              int threads, bool report) {
  const BenchArgs& a = bench.args();
  const int64_t steps = 64;
  Decoder dec(batch, a.bh, a.d, bench_projection(a), decoder_options(bench));
  fill(bench, dec, position);
  const int saved = num_threads();
  set_num_threads(threads);
  const auto [t, single] = time_steps(bench, dec, batch, fused, steps);
  set_num_threads(saved);
  if (report)
    emit_step(bench,
              legacy  ? "decode"
              : fused ? "dec_step"
                      : "dec_split",
              position, batch, threads, t, steps, single);
}

// The floor of a step's memory traffic on this machine: one pass that reads and writes every
// float of the B x --bh decoder states [F][Dv + 1] (what a step must do at least: update S and
// read it), at `threads` threads, heads split as the step splits them. Its tokens/s
// (B / pass) is the ceiling of a step whose states do not fit in the caches.
void state_pass_row(BenchRunner& bench, int64_t batch, int threads) {
  const BenchArgs& a = bench.args();
  const int64_t heads = batch * a.bh, per_head = a.m * (a.d + 1);  // F = m (positive), Dv = D
  std::vector<float> states(static_cast<size_t>(heads * per_head), 1.0f);
  float* s = states.data();
  const auto pass = [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t h = 0; h < heads; ++h) {
      float* x = s + h * per_head;
      for (int64_t i = 0; i < per_head; ++i) x[i] = x[i] * 0.9999f + 1e-4f;
    }
  };
  const Measured t = measure(
      [&] {
        for (int r = 0; r < 8; ++r) pass();
      },
      a.repeats, a.min_time);
  const double per_pass = t.seconds / 8.0, bytes = 2.0 * double(heads * per_head) * sizeof(float);
  bench.emit({{"method", "state_rw"},
              {"causal", true},
              {"n", 0},
              {"bh", heads},
              {"batch", batch},
              {"threads", threads},
              {"seconds", per_pass},
              {"gflops", nullptr},
              {"gbytes_per_s", bytes / per_pass / 1e9},
              {"tokens_per_s", double(batch) / per_pass},
              {"peak_heap_mb", t.heap_mb},
              {"rss_growth_mb", t.rss_mb}});
}

// VQDecoder steps of B sequences after `position` tokens: fused (step) or append + query.
void vq_step_row(BenchRunner& bench, int64_t position, int64_t batch, bool fused) {
  const BenchArgs& a = bench.args();
  const int64_t heads = a.bh, steps = 64, c = a.vq_codes;
  const Tensor codebook = std::get<1>(bench.inputs(heads, c, 4242));  // [1, H, c, D]: keys
  VQDecoder dec(batch, heads, a.d, codebook);
  const auto prompt = bench.inputs(batch * heads, position, 7);
  dec.append(as_batch(std::get<1>(prompt), batch, heads, 0, position),
             as_batch(std::get<2>(prompt), batch, heads, 0, position));
  const auto [t, single] = time_steps(bench, dec, batch, fused, steps);
  emit_step(bench, fused ? "vq_step" : "vq_split", position, batch, num_threads(), t, steps, single,
            favor::bench::vq_decode_step_flops(bench.problem(batch * heads, 1), c, false));
}

// Prefill of a prompt of n tokens of B = 1 x --bh heads into a fresh decoder, against causal
// favor_attention of the prompt then append (key features twice).
void prefill_rows(BenchRunner& bench, int64_t n) {
  const BenchArgs& a = bench.args();
  const Projection w = bench_projection(a);
  const DecoderOptions options = decoder_options(bench);
  const auto qkv = bench.inputs(a.bh, n, 5);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor y({1, a.bh, n, a.d});
  AttentionOptions o;
  o.kernel = options.kernel;
  o.causal = true;
  o.fit = options.fit;
  for (bool fused : {true, false}) {
    const Measured t = measure(
        [&] {
          Decoder dec(1, a.bh, a.d, w, options);
          if (fused) {
            dec.prefill(q, k, v, y.mutable_view());
          } else {
            favor_attention(q, k, v, w, y.mutable_view(), o);
            dec.append(k, v);
          }
        },
        a.repeats, a.min_time);
    bench.emit(timed_record(
        fused ? "prefill" : "causal+app", true, n, a.bh, num_threads(), t,
        favor::bench::favor_flops(bench.problem(a.bh, n), true, kernel_info().causal_chunk)));
  }
}

// The same for VQDecoder (hard VQ, --vq-codes codes): prefill against causal vq_attention
// then append (every key assigned twice).
void vq_prefill_rows(BenchRunner& bench, int64_t n) {
  const BenchArgs& a = bench.args();
  const int64_t c = std::min(a.vq_codes, n);
  const Tensor codebook = std::get<1>(bench.inputs(a.bh, c, 4242));
  const auto qkv = bench.inputs(a.bh, n, 5);
  const Tensor &q = std::get<0>(qkv), &k = std::get<1>(qkv), &v = std::get<2>(qkv);
  Tensor y({1, a.bh, n, a.d});
  VQOptions o;
  o.causal = true;
  for (bool fused : {true, false}) {
    const Measured t = measure(
        [&] {
          VQDecoder dec(1, a.bh, a.d, codebook);
          if (fused) {
            dec.prefill(q, k, v, y.mutable_view());
          } else {
            vq_attention(q, k, v, codebook, y.mutable_view(), o);
            dec.append(k, v);
          }
        },
        a.repeats, a.min_time);
    bench.emit(timed_record(fused ? "vq_prefill" : "vq_causal+app", true, n, a.bh, num_threads(), t,
                            favor::bench::vq_flops(bench.problem(a.bh, n), c, true, a.vq_block)));
  }
}

}  // namespace

void decode_step_row(BenchRunner& bench, int64_t position, int threads) {
  step_row(bench, position, 1, true, false, threads, true);
}

void state_rw_row(BenchRunner& bench, int threads) {
  state_pass_row(bench, 1, threads);
}

void section_decode(BenchRunner& bench) {
  const BenchArgs& a = bench.args();
  const std::vector<int64_t>& positions = a.decode_positions;
  if (positions.empty()) return;
  step_row(bench, positions.front(), 1, false, true, num_threads(), false);  // warm-up
  for (int64_t pos : positions) step_row(bench, pos, 1, false, true, num_threads(), true);
  const int64_t pos = std::min<int64_t>(positions.front(), 1024);
  for (int64_t batch : a.decode_batch) {
    for (int threads : {num_threads(), 1}) {
      for (bool fused : {false, true}) step_row(bench, pos, batch, fused, false, threads, true);
      state_pass_row(bench, batch, threads);
      if (num_threads() == 1) break;
    }
  }
  for (int64_t batch : a.decode_batch)
    for (bool fused : {false, true}) vq_step_row(bench, pos, batch, fused);
  if (a.decode_prompt > 0) {
    prefill_rows(bench, a.decode_prompt);
    vq_prefill_rows(bench, a.decode_prompt);
  }
}

}  // namespace favor::cli
