// sequence_parallel: Megatron-LM's sequence parallelism over the tensor-parallel MLP block
// (megatron.hpp), run beside plain tensor parallelism for comparison.
//
// Tensor parallelism leaves the activations outside the split (the residual stream, s x h per
// block) replicated on every rank. Sequence parallelism splits them along the sequence: the
// block's all_reduces become an all_gather before the column-parallel linear and a
// reduce_scatter after the row-parallel one (and the reverse in backward): the same bytes, since
// an all_reduce is a reduce-scatter then an all-gather, and s/t x h of those activations per rank.
//
//   sequence_parallel [-np T] [--transport threads|shm|tcp] [--steps S] [--hidden H] [--layers L]
//                     [--tokens-per-rank K]
//
// Prints both runs' collectives (checked against the counts and the ring's bytes), the bytes of
// the four main collectives against tp's two all_reduces, the activation bytes each rank keeps
// per block in each (measured), and whether each run matches the same training on one process.
#include "megatron.hpp"

int main(int argc, char** argv) {
  using namespace strategies;
  using namespace strategies::megatron;
  const cli c = parse(argc, argv, {{"hidden", true}, {"layers", true}, {"tokens-per-rank", true}},
                      "sequence_parallel [-np T] [--transport threads|shm|tcp] [--steps S] [--hidden H] [--layers L] [--tokens-per-rank K]");
  const shape sh = shape_of(c);
  return launch(c, [&](comm_t& world) {
    const int t = world.size(), r = world.rank();
    const int s = sh.tokens_per_rank * t;
    if (r == 0)
      std::printf("# sequence_parallel: %d ranks over %s; %d MLP blocks h = %d, f = %d; s = %d tokens, %d per rank in sp; %d steps\n", t,
                  c.transport.c_str(), sh.layers, sh.h, sh.f, s, sh.tokens_per_rank, c.steps);
    const auto ref = one_process(sh, sh.tokens_per_rank * t, c.steps);
    outcome o[2];
    const mode modes[2] = {mode::tp, mode::sp};
    for (int i = 0; i < 2; ++i) {
      o[i] = train(world, sh, modes[i], c.steps);
      print_and_check(o[i], sh, modes[i], t, r == 0);
      match m = compare(o[i], ref, sh, t, r);
      m.tol = tolerance(sh, t, c.steps);
      report(world, m, std::string(name(modes[i])) + ": parameters (each rank's shard) against one process", "8 S L (s + f) u, fp64");
    }
    // Bytes of the main collectives, measured per kind: tp's 2 all_reduces against sp's 2
    // all_gathers and 2 reduce_scatters.
    const double tp_b = double(o[0].led.sent_by("all_reduce Y (g)") + o[0].led.sent_by("all_reduce dX (f)"));
    const double sp_b = double(o[1].led.sent_by("all_gather X (g)") + o[1].led.sent_by("reduce_scatter Y (g-bar)") +
                               o[1].led.sent_by("all_gather dY (g-bar')") + o[1].led.sent_by("reduce_scatter dX (g')"));
    auto sent_of = [&](const outcome& x, const char* kind) { return double(x.led.sent_by(kind)); };
    if (r == 0) {
      std::printf("bytes each rank sent in a step (measured): tp's all_reduces %s; sp's all_gathers and reduce_scatters %s (%.4f x)\n",
                  ledger::human(tp_b).c_str(), ledger::human(sp_b).c_str(), tp_b > 0 ? sp_b / tp_b : 1.0);
      std::printf("  sp also re-gathers X in backward (%s) and sums the bias's gradient (%s): measured in all tp %s, sp %s\n",
                  ledger::human(sent_of(o[1], "all_gather X again (bwd)")).c_str(),
                  ledger::human(sent_of(o[1], "all_reduce grad b")).c_str(), ledger::human(double(o[0].led.sent)).c_str(),
                  ledger::human(double(o[1].led.sent)).c_str());
      const double repl_tp = double(s) * sh.h * sizeof(double), repl_sp = repl_tp / t;
      std::printf("activations kept per block and rank: tp %s, sp %s (the residual stream: s x h = %s in tp, s/t x h = %s in sp;\n"
                  "  the rest, U and GeLU(U), s x f/t, is split in both)\n",
                  ledger::human(double(o[0].activation_bytes)).c_str(), ledger::human(double(o[1].activation_bytes)).c_str(),
                  ledger::human(repl_tp).c_str(), ledger::human(repl_sp).c_str());
    }
    if (tp_b != sp_b) throw std::runtime_error("sequence_parallel: the main collectives' bytes (measured) differ from tp's");
    // The activations each keeps for backward (counted from the matrices it holds).
    const double saved = double(o[0].activation_bytes) - double(o[1].activation_bytes);
    const double want_saved = double(s) * sh.h * sizeof(double) * (1.0 - 1.0 / t);
    if (std::abs(saved - want_saved) > 0.5)
      throw std::runtime_error("sequence_parallel: sp keeps " + std::to_string(saved) + " B fewer activations than tp, not (1 - 1/t) s h");
  });
}
