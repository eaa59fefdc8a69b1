/* test_pp_schedule.c — pipeline schedules as data (src/runtime/pp_schedule.c, pp_simulate.c).
 *
 *   - every schedule x pp {2, 4} x micro-batches {4, 8} builds and passes the simulator (DualPipeV
 *     with fewer micro-batches than stages is refused naming the option, as torch refuses it);
 *   - each rank's compute order equals torch.distributed.pipelining's
 *     (tests/fixtures/pp_schedule/torch_orders.txt, tools/gen_pp_schedule_fixture.py);
 *   - simulated properties known in closed form: GPipe holds every micro-batch in flight, 1F1B
 *     at most pp - rank on rank r (also as peak bytes, gt_pp_schedule_peak_bytes); GPipe's and
 * 1F1B's bubble (B = 2 F) is (pp - 1) / (M + pp - 1) with M micro-batches; ZBVZeroBubble's bubble
 * is below 1F1B's;
 *   - the text form round-trips through gt_pp_action_parse;
 *   - hand-broken schedules are rejected naming the action: a receive moved after its use, a
 *     dropped send, an action on the wrong rank, a duplicate, and two ranks that each receive
 *     before they send (a deadlock across ranks);
 *   - bad options: an unknown schedule name, too few micro-batches for DualPipeV, a
 *     layers_per_stage that gives a stage count the degree does not divide, a batch the
 *     micro-batch size does not divide;
 *   - torchtitan's block split: debugmodel's 6 blocks on 2 and 4 stages;
 *   - the report of `graphtrain graph` from a config (gt_train_pp_print), and its errors;
 *   - point-to-point transfers refused where a communicator has none (fake), or to itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graphtrain/gt_comm.h"
#include "graphtrain/gt_pipeline.h"
#include "graphtrain/gt_train.h"
#include "gt_test.h"

static bool contains(const char *s, const char *sub)
{
    return strstr(s, sub) != NULL;
}

/* The rank's compute-only text, without the "rank R:" prefix and the newline. */
static void compute_text(const gt_pp_schedule *s, int32_t r, char *buf, size_t size)
{
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    gt_pp_schedule_print_rank(s, r, true, f);
    fclose(f);
    const char *p = strchr(mem, ':');
    snprintf(buf, size, "%s", p ? p + 2 : mem);
    buf[strcspn(buf, "\n")] = 0;
    free(mem);
}

static void test_all_schedules(void)
{
    for (int k = 0; k < GT_PP_N_SCHEDULES; k++) {
        for (int pp = 2; pp <= 4; pp += 2) {
            for (int m = 4; m <= 8; m += 4) {
                gt_pp_schedule s;
                gt_error err = {0};
                int spr = gt_pp_default_stages_per_rank((gt_pp_schedule_kind)k);
                gt_status st = gt_pp_schedule_build((gt_pp_schedule_kind)k, pp, spr, m, &s, &err);
                if (k == GT_PP_DUALPIPEV && m < 2 * pp) {
                    EXPECT(st == GT_ERR_INVALID &&
                               contains(err.msg, "pipeline_parallel_microbatch_size") &&
                               contains(err.msg, "DualPipeV"),
                           "DualPipeV pp %d m %d: %s", pp, m, err.msg);
                    continue;
                }
                EXPECT_OK(st, &err);
                if (st != GT_OK) continue;
                gt_pp_sim sim;
                EXPECT_OK(gt_pp_schedule_simulate(&s, &sim, &err), &err);
                if (err.code == GT_OK) {
                    printf("%-16s pp %d mb %d: makespan %3lld bubble %.3f peak in flight %d\n",
                           gt_pp_schedule_name((gt_pp_schedule_kind)k), pp, m,
                           (long long)sim.makespan, sim.bubble, sim.max_in_flight);
                    double closed = (double)(pp - 1) / (m + pp - 1);
                    if (k == GT_PP_GPIPE || k == GT_PP_1F1B)
                        EXPECT(sim.bubble > closed - 1e-12 && sim.bubble < closed + 1e-12,
                               "%s pp %d m %d bubble %f, expected %f",
                               gt_pp_schedule_name((gt_pp_schedule_kind)k), pp, m, sim.bubble,
                               closed);
                    for (int r = 0; r < pp; r++) {
                        if (k == GT_PP_GPIPE)
                            EXPECT(sim.peak_in_flight[r] == m, "GPipe rank %d peak %d", r,
                                   sim.peak_in_flight[r]);
                        if (k == GT_PP_1F1B)
                            EXPECT(sim.peak_in_flight[r] == (pp - r < m ? pp - r : m),
                                   "1F1B rank %d peak %d", r, sim.peak_in_flight[r]);
                    }
                    gt_pp_sim_free(&sim);
                }
                gt_pp_schedule_free(&s);
            }
        }
    }
    /* peak activation bytes: GPipe holds all 4 micro-batches, 1F1B pp - rank of them */
    {
        gt_pp_schedule a;
        gt_error err = {0};
        int64_t bytes[2] = {10, 20}, peak[2];
        EXPECT_OK(gt_pp_schedule_build(GT_PP_GPIPE, 2, 1, 4, &a, &err), &err);
        gt_pp_schedule_peak_bytes(&a, bytes, peak);
        EXPECT(peak[0] == 40 && peak[1] == 80, "GPipe peak %lld %lld", (long long)peak[0],
               (long long)peak[1]);
        gt_pp_schedule_free(&a);
        EXPECT_OK(gt_pp_schedule_build(GT_PP_1F1B, 2, 1, 4, &a, &err), &err);
        gt_pp_schedule_peak_bytes(&a, bytes, peak);
        EXPECT(peak[0] == 20 && peak[1] == 20, "1F1B peak %lld %lld", (long long)peak[0],
               (long long)peak[1]);
        gt_pp_schedule_free(&a);
    }
    /* the zero-bubble V fills what 1F1B leaves idle */
    for (int pp = 2; pp <= 4; pp += 2) {
        gt_pp_schedule a, b;
        gt_pp_sim sa, sb;
        gt_error err = {0};
        EXPECT_OK(gt_pp_schedule_build(GT_PP_1F1B, pp, 1, 8, &a, &err), &err);
        EXPECT_OK(gt_pp_schedule_build(GT_PP_ZBV_ZERO_BUBBLE, pp, 2, 8, &b, &err), &err);
        EXPECT_OK(gt_pp_schedule_simulate(&a, &sa, &err), &err);
        EXPECT_OK(gt_pp_schedule_simulate(&b, &sb, &err), &err);
        EXPECT(sb.bubble < sa.bubble, "pp %d: ZBV bubble %f, 1F1B %f", pp, sb.bubble, sa.bubble);
        gt_pp_sim_free(&sa);
        gt_pp_sim_free(&sb);
        gt_pp_schedule_free(&a);
        gt_pp_schedule_free(&b);
    }
}

static void test_torch_orders(void)
{
    FILE *f = fopen(gt_test_path("tests/fixtures/pp_schedule/torch_orders.txt"), "r");
    EXPECT(f != NULL, "fixture missing");
    if (!f) return;
    char line[8192], mine[8192];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        int pp, m, r, off = 0;
        if (sscanf(line, "%63s %d %d rank %d: %n", name, &pp, &m, &r, &off) != 4) continue;
        char *want = line + off;
        want[strcspn(want, "\n")] = 0;
        gt_pp_schedule_kind k;
        gt_pp_schedule s;
        gt_error err = {0};
        EXPECT_OK(gt_pp_schedule_from_name(name, &k, &err), &err);
        EXPECT_OK(gt_pp_schedule_build(k, pp, gt_pp_default_stages_per_rank(k), m, &s, &err), &err);
        if (err.code != GT_OK) continue;
        compute_text(&s, r, mine, sizeof mine);
        EXPECT(!strcmp(mine, want), "%s pp %d m %d rank %d:\n  ours  %s\n  torch %s", name, pp, m,
               r, mine, want);
        gt_pp_schedule_free(&s);
        n++;
    }
    fclose(f);
    EXPECT(n == 52, "compared %d fixture lines", n);
}

static void test_text_round_trip(void)
{
    gt_pp_schedule s;
    gt_error err = {0};
    EXPECT_OK(gt_pp_schedule_build(GT_PP_DUALPIPEV, 2, 2, 8, &s, &err), &err);
    for (int r = 0; r < s.n_ranks; r++) {
        for (int i = 0; i < s.n_actions[r]; i++) {
            char buf[48];
            gt_pp_action a;
            gt_pp_action_format(s.actions[r][i], buf, sizeof buf);
            EXPECT_OK(gt_pp_action_parse(buf, &a, &err), &err);
            EXPECT(a.kind == s.actions[r][i].kind && a.stage == s.actions[r][i].stage &&
                       a.mb == s.actions[r][i].mb,
                   "%s", buf);
        }
    }
    gt_pp_schedule_free(&s);
    gt_pp_action a;
    EXPECT(gt_pp_action_parse("1X0", &a, &err) == GT_ERR_INVALID && contains(err.msg, "\"1X0\""),
           "%s", err.msg);
}

/* Finds the action in rank r's list. */
static int find(const gt_pp_schedule *s, int r, const char *text)
{
    gt_pp_action want;
    gt_error err = {0};
    if (gt_pp_action_parse(text, &want, &err) != GT_OK) return -1;
    for (int i = 0; i < s->n_actions[r]; i++)
        if (s->actions[r][i].kind == want.kind && s->actions[r][i].stage == want.stage &&
            s->actions[r][i].mb == want.mb)
            return i;
    return -1;
}

/* Moves rank r's action `from` to position `to`, shifting the ones between. */
static void move(gt_pp_schedule *s, int r, int from, int to)
{
    gt_pp_action a = s->actions[r][from];
    if (from < to)
        memmove(&s->actions[r][from], &s->actions[r][from + 1], (size_t)(to - from) * sizeof a);
    else
        memmove(&s->actions[r][to + 1], &s->actions[r][to], (size_t)(from - to) * sizeof a);
    s->actions[r][to] = a;
}

static void expect_rejected(gt_pp_schedule *s, const char *what, const char *needle1,
                            const char *needle2)
{
    gt_pp_sim sim;
    gt_error err = {0};
    gt_status st = gt_pp_schedule_simulate(s, &sim, &err);
    EXPECT(st == GT_ERR_INVALID && contains(err.msg, needle1) && contains(err.msg, needle2),
           "%s: %s", what, err.msg);
    printf("%s: %s\n", what, err.msg);
    if (st == GT_OK) gt_pp_sim_free(&sim);
}

static void test_broken(void)
{
    gt_pp_schedule s;
    gt_error err = {0};
    /* 1F1B pp 2: rank 1 runs 1RECV_F0 1F0 ...; the receive moved after the forward */
    EXPECT_OK(gt_pp_schedule_build(GT_PP_1F1B, 2, 1, 4, &s, &err), &err);
    int recv = find(&s, 1, "1RECV_F0"), fwd = find(&s, 1, "1F0");
    EXPECT(recv >= 0 && fwd == recv + 1, "recv %d fwd %d", recv, fwd);
    move(&s, 1, recv, fwd);
    expect_rejected(&s, "receive after its use", "rank 1 action 0 (1F0) needs 1RECV_F0",
                    "comes later");
    gt_pp_schedule_free(&s);

    /* a dropped send: rank 0 never sends 0SEND_F2 */
    EXPECT_OK(gt_pp_schedule_build(GT_PP_GPIPE, 2, 1, 4, &s, &err), &err);
    int send = find(&s, 0, "0SEND_F2");
    EXPECT(send >= 0, "0SEND_F2 at %d", send);
    memmove(&s.actions[0][send], &s.actions[0][send + 1],
            (size_t)(s.n_actions[0] - send - 1) * sizeof s.actions[0][0]);
    s.n_actions[0]--;
    expect_rejected(&s, "dropped send", "1RECV_F2", "no matching 0SEND_F2 on rank 0");
    gt_pp_schedule_free(&s);

    /* an action on the wrong rank: rank 0 runs stage 1's forward */
    EXPECT_OK(gt_pp_schedule_build(GT_PP_GPIPE, 2, 1, 4, &s, &err), &err);
    s.actions[0][0].stage = 1;
    expect_rejected(&s, "wrong rank", "rank 0 action 0 (1F0)", "stage 1 runs on rank 1");
    gt_pp_schedule_free(&s);

    /* a duplicate: rank 1's second forward replaced by its first */
    EXPECT_OK(gt_pp_schedule_build(GT_PP_GPIPE, 2, 1, 4, &s, &err), &err);
    int f1 = find(&s, 1, "1F1");
    s.actions[1][f1].mb = 0;
    expect_rejected(&s, "duplicate", "(1F0) runs twice", "action 1");
    gt_pp_schedule_free(&s);

    /* a deadlock across ranks: rank 0 waits for the gradient of micro-batch 0 before it sends
     * its forward, and rank 1 waits for that forward before it can send the gradient */
    EXPECT_OK(gt_pp_schedule_build(GT_PP_GPIPE, 2, 1, 4, &s, &err), &err);
    int rb = find(&s, 0, "0RECV_B0"), f0 = find(&s, 0, "0F0");
    move(&s, 0, rb, f0);
    expect_rejected(&s, "deadlock", "deadlock: rank 0 waits at action 0 (0RECV_B0)",
                    "rank 1 waits at action 0 (1RECV_F0) for 0SEND_F0");
    gt_pp_schedule_free(&s);
}

static void test_options(void)
{
    gt_pp_layout l;
    gt_error err = {0};
    EXPECT(gt_pp_layout_init("Looped1F1B", 2, 6, -1, 1, 1, 4, 1, &l, &err) == GT_ERR_INVALID &&
               contains(err.msg, "--parallelism.pipeline_parallel_schedule") &&
               contains(err.msg, "Looped1F1B"),
           "%s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_pp_layout_init("1F1B", 2, 6, -1, 1, 1, 6, 4, &l, &err) == GT_ERR_INVALID &&
               contains(err.msg, "--parallelism.pipeline_parallel_microbatch_size = 4"),
           "%s", err.msg);
    gt_error_clear(&err);
    /* 6 blocks + 1 + 1 by 3 per stage: 3 stages, not divisible by 2 */
    EXPECT(gt_pp_layout_init("Interleaved1F1B", 2, 6, 3, 1, 1, 8, 1, &l, &err) == GT_ERR_INVALID &&
               contains(err.msg, "--parallelism.pipeline_parallel_layers_per_stage = 3") &&
               contains(err.msg, "not divisible"),
           "%s", err.msg);
    gt_error_clear(&err);
    /* 1F1B with 2 per stage: 4 stages on 2 ranks, but 1F1B runs one stage per rank */
    EXPECT(gt_pp_layout_init("1F1B", 2, 6, 2, 1, 1, 8, 1, &l, &err) == GT_ERR_INVALID &&
               contains(err.msg, "pipeline_parallel_layers_per_stage") &&
               contains(err.msg, "exactly 1"),
           "%s", err.msg);
    gt_error_clear(&err);
    /* DualPipeV on 2 ranks (4 stages) with 2 micro-batches */
    gt_pp_schedule s;
    EXPECT(gt_pp_schedule_build(GT_PP_DUALPIPEV, 2, 2, 2, &s, &err) == GT_ERR_INVALID &&
               contains(err.msg, "--parallelism.pipeline_parallel_microbatch_size"),
           "%s", err.msg);
    gt_error_clear(&err);
    /* a good one: debugmodel's 6 blocks, ZBV on 2 ranks */
    EXPECT_OK(gt_pp_layout_init("ZBVZeroBubble", 2, 6, -1, 1, 1, 8, 2, &l, &err), &err);
    EXPECT(l.n_stages == 4 && l.stages_per_rank == 2 && l.n_micro == 4, "%d %d %d", l.n_stages,
           l.stages_per_rank, l.n_micro);
    gt_pp_layout_free(&l);
}

static void test_layer_split(void)
{
    /* torchtitan, 6 blocks, weights 1 and 1: 8 effective layers.
     * 2 stages: [emb, 0, 1, 2] [3, 4, 5, norm+out]; 4 stages: [emb, 0] [1, 2] [3, 4] [5, out] */
    int64_t fl[5];
    gt_error err = {0};
    EXPECT_OK(gt_pp_split_layers(6, 2, 1, 1, fl, &err), &err);
    EXPECT(fl[0] == 0 && fl[1] == 3 && fl[2] == 6, "%lld %lld %lld", (long long)fl[0],
           (long long)fl[1], (long long)fl[2]);
    EXPECT_OK(gt_pp_split_layers(6, 4, 1, 1, fl, &err), &err);
    EXPECT(fl[0] == 0 && fl[1] == 1 && fl[2] == 3 && fl[3] == 5 && fl[4] == 6,
           "%lld %lld %lld %lld %lld", (long long)fl[0], (long long)fl[1], (long long)fl[2],
           (long long)fl[3], (long long)fl[4]);
    /* 7 effective layers on 3 stages: 3, 2, 2 -> [emb, 0, 1] [2, 3] [4, out] */
    EXPECT_OK(gt_pp_split_layers(5, 3, 1, 1, fl, &err), &err);
    EXPECT(fl[0] == 0 && fl[1] == 2 && fl[2] == 4 && fl[3] == 5, "%lld %lld %lld %lld",
           (long long)fl[0], (long long)fl[1], (long long)fl[2], (long long)fl[3]);
    /* more stages than effective layers */
    EXPECT(gt_pp_split_layers(2, 8, 1, 1, fl, &err) == GT_ERR_INVALID &&
               contains(err.msg, "pipeline_parallel_degree"),
           "%s", err.msg);
    gt_error_clear(&err);
    int64_t fl2[3];
    EXPECT(gt_pp_split_layers(2, 2, 4, 1, fl2, &err) == GT_ERR_INVALID &&
               contains(err.msg, "first_stage_less_layers = 4"),
           "%s", err.msg);
}

/* The report from the options, as `graphtrain graph` prints it; "" and the error on failure. */
static char *report(const char *const *opts, gt_error *err)
{
    gt_config cfg;
    gt_config_defaults(&cfg);
    for (int i = 0; opts[i]; i += 2)
        EXPECT_OK(gt_config_set(&cfg, opts[i], opts[i + 1], err), err);
    gt_model_config mc;
    EXPECT_OK(gt_train_model_config(&cfg, &mc, err), err);
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    gt_status st = gt_train_pp_print(&cfg, &mc, f, err);
    fclose(f);
    gt_config_free(&cfg);
    if (st != GT_OK) mem[0] = 0;
    return mem;
}

static void test_report(void)
{
    gt_error err = {0};
    static const char *const ok[] = {"parallelism.pipeline_parallel_degree",
                                     "2",
                                     "parallelism.pipeline_parallel_schedule",
                                     "Interleaved1F1B",
                                     "training.local_batch_size",
                                     "4",
                                     NULL};
    char *r = report(ok, &err);
    EXPECT(contains(r, "# pipeline: Interleaved1F1B, pipeline_parallel_degree 2, 4 stages (2 per "
                       "rank), 4 micro-batches") &&
               contains(r, "stage 0   rank 0   tok_embeddings + layers 0\n") &&
               contains(r, "stage 3   rank 1   layers 5 + norm, output, loss\n") &&
               contains(r, "rank 1: 1RECV_F0 1F0 1SEND_F0") &&
               contains(r, "bubble           0.111") && contains(r, "stage  forward  dI  dW") &&
               contains(r, "global ") && contains(r, "peak activations rank 0 "),
           "%s", r);
    free(r);
    static const char *const bad[] = {"parallelism.pipeline_parallel_degree", "2",
                                      "parallelism.pipeline_parallel_layers_per_stage", "3", NULL};
    r = report(bad, &err);
    EXPECT(!r[0] && contains(err.msg, "--parallelism.pipeline_parallel_layers_per_stage = 3"), "%s",
           err.msg);
    free(r);
}

static void test_p2p_refused(void)
{
    gt_comm *c = NULL;
    gt_error err = {0};
    EXPECT_OK(gt_comm_fake_create(2, 0, &c, &err), &err);
    if (!c) return;
    int64_t shape[1] = {4};
    gt_tensor t;
    EXPECT_OK(gt_tensor_alloc(&t, GT_F32, 1, shape, &err), &err);
    EXPECT(gt_comm_send_start(c, &t, 1, 0, &err) == GT_ERR_UNSUPPORTED &&
               contains(err.msg, "fake") && contains(err.msg, "point-to-point"),
           "%s", err.msg);
    gt_error_clear(&err);
    EXPECT(gt_comm_recv(c, &t, 1, 0, &err) == GT_ERR_UNSUPPORTED, "%s", err.msg);
    EXPECT_OK(gt_comm_send_wait_all(c, &err), &err);
    gt_tensor_free(&t);
    gt_comm_destroy(c);
}

int main(void)
{
    test_all_schedules();
    test_torch_orders();
    test_text_round_trip();
    test_broken();
    test_options();
    test_layer_split();
    test_report();
    test_p2p_refused();
    return gt_test_finish();
}
