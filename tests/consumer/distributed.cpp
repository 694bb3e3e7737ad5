// Uses the installed favor::distributed: one MPI process (a singleton, no mpirun) runs
// sequence-parallel attention over MPI_COMM_WORLD and must match favor_attention.
#include <cmath>
#include <favor/distributed.hpp>
#include <favor/favor.hpp>
#include <iostream>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const favor::Shape4 shape{1, 2, 30, 8};
  favor::Tensor q(shape), k(shape), v(shape), out(shape);
  for (int64_t i = 0; i < q.numel(); ++i) {
    q.data()[i] = 0.3f * static_cast<float>((i * 37) % 11) / 11.0f;
    k.data()[i] = 0.3f * static_cast<float>((i * 53) % 13) / 13.0f;
    v.data()[i] = static_cast<float>((i * 7) % 5);
  }
  const favor::Projection w = favor::Projection::draw(64, 8);
  favor::AttentionOptions o;
  o.causal = true;
  favor::distributed::attention(q, k, v, w, out.mutable_view(), o);
  const favor::Tensor want = favor::favor_attention(q, k, v, w, o);
  const double err = favor::relative_frobenius_error(out, want);
  std::cout << "distributed (1 rank) against favor_attention: " << err << '\n';
  MPI_Finalize();
  return err < 1e-5 ? 0 : 1;
}
