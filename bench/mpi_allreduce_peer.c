/* The peer of bench/comm_vs_openmpi.sh: the MPI library's own blocking MPI_Allreduce (float32,
 * sum, in place), timed as `meshtrain bench comm` times its operations: every rank times each
 * of its back-to-back iterations, an element-wise MPI_MAX over ranks gives each iteration's
 * slowest rank, and the figure is the median over iters x reps iterations.
 *
 * Usage: mpirun ... mpi_allreduce_peer ITERS REPS WARMUP SIZE_BYTES...
 * Prints one line per size: "SIZE_BYTES MEDIAN_US". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 5) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce_peer ITERS REPS WARMUP SIZE_BYTES...\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int iters = atoi(argv[1]), reps = atoi(argv[2]), warmup = atoi(argv[3]);
  for (int a = 4; a < argc; ++a) {
    const long bytes = atol(argv[a]);
    const int n = (int)(bytes / 4);
    float* x = malloc((size_t)n * sizeof(float));
    double* t = malloc((size_t)iters * sizeof(double));
    double* all = malloc((size_t)iters * (size_t)reps * sizeof(double));
    for (int i = 0; i < n; ++i) x[i] = 0.0f;
    for (int i = 0; i < warmup; ++i) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      double prev = now();
      for (int i = 0; i < iters; ++i) {
        MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        const double cur = now();
        t[i] = cur - prev;
        prev = cur;
      }
      MPI_Allreduce(MPI_IN_PLACE, t, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      memcpy(all + (size_t)r * (size_t)iters, t, (size_t)iters * sizeof(double));
    }
    qsort(all, (size_t)iters * (size_t)reps, sizeof(double), cmp);
    if (rank == 0) printf("%ld %.3f\n", bytes, all[(size_t)iters * (size_t)reps / 2] * 1e6);
    fflush(stdout);
    free(x);
    free(t);
    free(all);
  }
  MPI_Finalize();
  return 0;
}
