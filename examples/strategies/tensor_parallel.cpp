// tensor_parallel: Megatron-LM's MLP block split over a tensor-parallel group (megatron.hpp).
//
// A column-parallel linear (A split by columns), GeLU, then a row-parallel one (B split by rows):
// forward ends in one all_reduce of the block's output (Megatron's g), backward in one all_reduce
// of the gradient at its input (f): 2 all_reduces of s x h per block and step, whatever t is.
// The variant --variant gather all-gathers the column-parallel output instead and multiplies by
// the whole B on every rank: (t-1)/t s f in forward instead of the all_reduce's 2 (t-1)/t s h,
// f/(2h) = 2 times the bytes, and B replicated.
//
//   tensor_parallel [-np T] [--transport threads|shm|tcp] [--steps S] [--variant tp|gather|both]
//                   [--hidden H] [--layers L] [--tokens-per-rank K]
//
// Prints the group, each variant's collectives per step (checked against Megatron's count and
// the ring's bytes), and whether the run matches the same training on one process.
#include "megatron.hpp"

int main(int argc, char** argv) {
  using namespace strategies;
  using namespace strategies::megatron;
  const cli c = parse(argc, argv, {{"variant", true}, {"hidden", true}, {"layers", true}, {"tokens-per-rank", true}},
                      "tensor_parallel [-np T] [--transport threads|shm|tcp] [--steps S] [--variant tp|gather|both] [--hidden H] "
                      "[--layers L] [--tokens-per-rank K]");
  const shape sh = shape_of(c);
  const std::string v = c.gets("variant", "both");
  std::vector<mode> modes;
  if (v == "tp" || v == "both") modes.push_back(mode::tp);
  if (v == "gather" || v == "both") modes.push_back(mode::tp_gather);
  return launch(c, [&](comm_t& world) {
    const int t = world.size(), r = world.rank();
    if (r == 0) {
      std::printf("# tensor_parallel: %d ranks over %s; %d MLP blocks h = %d, f = 4h = %d; s = %d tokens (replicated); %d steps, SGD\n", t,
                  c.transport.c_str(), sh.layers, sh.h, sh.f, sh.tokens_per_rank * t, c.steps);
      const collx::partition cols(std::size_t(sh.f), t);
      std::printf("group tp: all %d ranks; each holds its columns of A and a, the same rows of B, and all of b:", t);
      for (int i = 0; i < t; ++i) std::printf(" [%zu, %zu)", cols.offset(i), cols.end(i));
      std::printf("\n");
    }
    const auto ref = one_process(sh, sh.tokens_per_rank * t, c.steps);
    for (mode md : modes) {
      const outcome o = train(world, sh, md, c.steps);
      if (r == 0) std::printf("%s: loss by step:", name(md));
      for (double l : o.losses)
        if (r == 0) std::printf(" %.6f", l);
      if (r == 0) std::printf("\n");
      print_and_check(o, sh, md, t, r == 0);
      match m = compare(o, ref, sh, t, r);
      m.tol = tolerance(sh, t, c.steps);
      report(world, m, std::string(name(md)) + ": parameters (each rank's shard) against one process", "8 S L (s + f) u, fp64");
    }
  });
}
