/* bench_host_comm.c — graphtrain's host all-gather (the MPI communicator: the final parameter
 * hash, checkpoint saves) against a plain blocking MPI_Allgather of the same bytes, in the same
 * run. Run under mpirun, e.g.
 *   mpirun -np 4 build/bench_host_comm 256        # MiB per rank (default 256)
 * Add `--mca btl_vader_single_copy_mechanism none` to see Open MPI's shared-memory transport
 * without CMA (as in containers that refuse it), where the wait's polling sets the speed. */
#include "graphtrain/gt_comm.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    gt_error err = {0};
    gt_comm *w;
    if (gt_comm_mpi_world(&argc, &argv, &w, &err) != GT_OK) {
        fprintf(stderr, "bench_host_comm: %s\n", err.msg);
        return 1;
    }
    int64_t mib = argc > 1 ? atoll(argv[1]) : 256;
    int64_t n = mib << 18, all_n = n * w->size; /* f32 elements */
    gt_tensor mine, all;
    if (mib < 1 || mib > 2047 || gt_tensor_alloc(&mine, GT_F32, 1, &n, &err) != GT_OK ||
        gt_tensor_alloc(&all, GT_F32, 1, &all_n, &err) != GT_OK) {
        fprintf(stderr, "bench_host_comm: MiB per rank %lld: expected 1..2047 (%s)\n",
                (long long)mib, err.msg);
        return 1;
    }
    memset(mine.data, w->rank, (size_t)n * 4);
    memset(all.data, 0, (size_t)all_n * 4); /* touched once: page faults stay out of the times */
    double received_gb = (double)(all_n - n) * 4 / 1e9;
    for (int rep = 0; rep < 3; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (gt_comm_all_gather(w, &mine, &all, &err) != GT_OK) {
            fprintf(stderr, "bench_host_comm: %s\n", err.msg);
            return 1;
        }
        double t_gt = MPI_Wtime() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Allgather(mine.data, (int)(n * 4), MPI_BYTE, all.data, (int)(n * 4), MPI_BYTE,
                      MPI_COMM_WORLD);
        double t_mpi = MPI_Wtime() - t0;
        if (w->rank == 0)
            printf(
                "all-gather %lld MiB per rank, %d ranks: graphtrain %.3f s (%.2f GB/s received), "
                "MPI_Allgather %.3f s (%.2f GB/s)\n",
                (long long)mib, w->size, t_gt, received_gb / t_gt, t_mpi, received_gb / t_mpi);
    }
    gt_tensor_free(&mine);
    gt_tensor_free(&all);
    gt_comm_destroy(w);
    return gt_comm_mpi_finalize(&err) == GT_OK ? 0 : 1;
}
