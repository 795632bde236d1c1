#!/bin/bash
# What waits for the H200 (`RECURSCAN_COMMIT=<hash> bash benchmarks/pending_gpu.sh STEPS`, from the
# repository root with .whl carried: fla_core-0.6.0-py3-none-any.whl and the mamba_ssm sdist). Each
# step has its own time limit so that one hang cannot take the others' results; $OUT receives the
# files. Pass the commit explicitly: the device's copy may report an older HEAD.
#
#   0. The GPU suite but the tests marked unproven (kernels not yet run on a GPU, or whose planner
#      row is off), and a loss reading one output alone (the other's cotangent None): 218 passed on
#      the H200 at 60291e3 (results/gpu_tests_60291e3.log); 244 passed, 2 skipped on an H100 at e05461d
#      (git show c94269e:benchmarks/results/gpu_tests_h100_e05461d.log); 253 passed, 2 skipped on an H100 at
#      1d915c3 (git show ec30501:benchmarks/results/gpu_tests_h100_1d915c3.log); 258 passed, 2 skipped on an H100 at 2295218 with the
#      warp-specialised WY sweep planned (git show ec30501:benchmarks/results/gpu_tests_ws_on_h100_2295218.log); 267 passed, 2 skipped on H100s at
#      d0c9d6a and 0d7116d with the chained schedule planned, without and with its lead (git show b281a51:benchmarks/results/gpu_tests_h100_0d7116d.log),
#      and at b281a51 with the fused kernel's split barrier (results/gpu_tests_h100_b281a51.log); four workers on cards
#      under 100 GB (cold: ~270-320 s).
#   7. The forward rows as planned (the record), and the group prep on 8 warps for simple GLA and
#      SSD (results/gpu_gla_sweep_h100_4981221.json on the H100; the H200's last at d529156).
#   3. SSD's cold first forward + backward in a fresh process (target 10 s): 7.2 and 8.9 s on the
#      H100 at 4981221, 9.8 and 8.6 s on the H200 at 10c2e28 (before the early compile built the
#      backward's unread-output signature).
#   2. transformers' Mamba2 mixer trained for 50 steps against its torch path
#      (results/train_mamba2_mixer.{json,png}, H200 at 10c2e28).
#   5. Forward + backward (SSD B1 / B4, simple GLA B4) with the coef prefetch on (200 s: on a fresh
#      H200 at 60291e3 it compiled its variants and ran out of 120 s before writing), then off in a
#      process of its own (results/gpu_gla_train_h100_4981221.json on the H100; the H200's at
#      10c2e28, before the stages stored the gradients their caller narrows in its dtypes).
#   6. transformers' Mamba2 forward (4 layers, B4 T2048) with recurscan's op against its torch
#      path (target 3x; 65.8x on the H200 at 10c2e28).
#   1, 4. (Ran at d529156.) The forward's group-prep variants and the coef prefetch's A/B.
#   8. Issue 19: dq/dk warp-specialised in Gluon (off in the planner): its GPU tests (marked
#      unproven), then GDN forward + backward at B4 T4096 as planned and with it (GPU time by
#      kernel). At 4981221 on an H100 two of its tests failed on dg (1.2-1.6e-5 from the Triton
#      kernel's against a bound of 1e-5, concentrated in the last rows of a chunk:
#      `python -m benchmarks.diag_dqdk_specialised`, results/diag_dqdk_specialised_h100_c1b4b1c.json)
#      and it was slower at B4 (407 us against the twin's 385) and 2% faster at B1.
#      `... 9` the same at B1 T16384 HV32 on the same warm machine.
#  10. tests/test_hardening_gradients.py on the GPU (a call of its own): 38 passed on an H100 at
#      242f63d, the GDP scores kernel planned (results/gpu_tests_hardening_gradients_h100_242f63d.log).
#  11. Issue 19's cold row: GDN B1 T16384 HV32's first forward + backward in fresh processes (target
#      10 s), as it is measured and with torch's own first-autograd.grad import (sympy, ~2 s) done
#      first: on the H200 at ecf0925 8.47-10.46 s and 6.34-7.26 s (results/gpu_delta_cold*_ecf0925.json).
#  12. Where dq/dk's warp-specialised form departs (dg and dk by row of the chunk, chunk and head)
#      and whether two of its runs give the same bits (`benchmarks/diag_dqdk_specialised.py`).
#  13. The reverse sweep's Gluon twin for Gated Delta Product (M = 2): its tests, the scores kernel's
#      tests, and GDP M = 2 B4 T4096 forward + backward as planned and without it (planned since 94411ab).
#  14. dq/dk's warp-specialised form again, its gates' scans relaid as the twin's (the dg departure
#      of step 12 came from the decays' prefix sums associating pairs first): its tests, then GDN B4 and
#      B1 forward + backward as planned and with it.
#  15. dq and dk's Gluon twin for Gated Delta Product (M = 2): its tests and the GDP reverse sweep's,
#      GDN's dq/dk twin tests, then GDP M = 2 B4 T4096 forward + backward with the planned twins and
#      with it, and GDN B4 against the commit before (build/prev carried: `git archive c34e944 recurscan
#      | tar -x -C build/prev`, renamed recurscan_prev). At 7abbdb8 on an H100: every test passed, 737 us
#      against 935, GDN's unchanged (planned since 5e509f6).
#  16. GDP M = 2 at K = 64 (V = 128) forward + backward: as planned, with the reverse sweep's GDP twin,
#      and with dq and dk's too. At 03a6666 on an H100 the reverse sweep's faster (292 us against 396),
#      dq and dk's slower (596 against 555): plan.delta.GLUON_GDP_REVERSE_SWEEP_KEY_DIMS, GLUON_DQDK_KEY_DIMS.
#  17. GDN B4 T4096 at K = 64 (V = 128) forward + backward as planned and with each backward twin off
#      in turn. On the H200 at ecf0925: the reverse sweep's and the scores kernel's twins faster, dq and
#      dk's slower (284-288 us against 274), so planned at K 128 alone; two variants' eager step times
#      did not follow their kernels' sums (perf-history, 2026-12-05, ecf0925): run it again.
#  18. Non-finite input of one sequence through the Gluon twins (GDN: q, k poisoned, and the
#      warp-specialised forms; GDP at M = 2 through the reverse sweep's and dq and dk's twins), and
#      GDP's dq/dk twin without a decay: 9 passed on an H100 at 28dda89.
#  19. dq and dk's Gluon twin on a ring of four stages (plan.delta.GLUON_DQDK_STAGES: four planned for
#      GDN, three for GDP since fa1eb8e; at four all of the next item's steps load under this one's
#      epilogue): GDN B4, B1 and GDP forward + backward as planned and at four stages, one process each.
#  20. The warp-specialised scores kernel for Gated Delta Product (M = 2: a chunk's rows copy-major, the
#      query's copy first) and dq and dk's twin on four stages: their GPU tests (marked unproven), then
#      GDP M = 2 B4 T4096 forward + backward as planned and with the scores kernel, and GDN B4, B1 and
#      GDP at four stages (step 19's), each only where its tests passed (`... 21` on the same warm machine).
#  22. Issue 21: one prep program's latency alone on an SM and sharing it (`benchmarks/gpu_prep_latency.py`):
#      the figure a prep computed beside the chain (docs/kernels-chunk-delta.md, "What bounds the speed")
#      must bring under a chain step (~2.6 us at BV 128). On an H100 at e05461d: 8.1 us alone, 4.5 us of
#      SM-time at three an SM (results/gpu_prep_latency_h100_e05461d.json).
#  23. Issue 21: the chunk's WY inverse alone in its two forms (`benchmarks/inverse_forms.py`: the prep's
#      five levels of [64, 64] products against 16 x 16 blocks merged by 16 x 16 products) at B1's and
#      HV64's item counts, each reading A or forming it from k first (the prep's stage 2 whole). Offline
#      (sm_90) the blocks form (its diagonal blocks a batch, a warp a block) is 900 PTX instructions, 32
#      mma.sync, 27 barriers, 4 KB of shared memory against the prep's form's 1269, 40 wgmma, 23, 24 KB;
#      from k 1372, 96 mma.sync, 31 against 1163, 48 wgmma, 23 (at 8 warps 799 / 1191 against 1056 / 1194).
#      Also one program an SM (132 items: a program's latency) and 8 warps a program. On an H100 at
#      6166af2 (4 warps, 132 and 8192 items; results/inverse_forms_h100_6166af2.json): at 8192 items the
#      blocks form reading A 88.6 us against the prep's form's 173.6 (split 127.7); from k the split form
#      107.8 against 130.2 (blocks 139.8); at 132 items all 8.5-9.4 us. 8 warps and 32768 items not run.
#  24. The prep's inverse split into 16 x 16 diagonal blocks (plan.delta.PREP_SPLIT_INVERSE): the prep's
#      GPU tests at real sizes with it on (and the test of it against the whole-tile form),
#      then the prefill rows with it on against the whole-tile form (build/base holding 7302e8b's
#      package as recurscan_prev: `git archive 7302e8b recurscan | tar -x -C build/base`, renamed), at
#      16 rows and at 32 (SPLITS=16 for one). On an H100 at 6166af2 (16 only): 7 GPU tests passed,
#      the prep 10-13% faster, every row faster (results/ab_split_inverse*_h100_6166af2.json); planned at
#      16 since then; its accuracy test against the whole-tile form passed on an H100 at e05461d. Not yet
#      on the H200.
#  26. Issue 21: the Gluon prep prototype (benchmarks/gluon_prep_proto.py: the inverse on small products through
#      shared memory; dense GDN, contraction chunks) against the Triton prep as planned at B1 T16384 HV32, B4
#      T8192 HV64 and B4 T4096: outputs compared, each through the planned sweep against float64, each prep
#      timed alone, uncapped and at 168 registers. On an H100 at 149b385: right (wy 1e-4 from the Triton
#      prep's, the outputs' error equal), 18-20% slower at 168 registers, the same latency alone
#      (results/gluon_prep_proto_h100_149b385.json).
#  27. The same prototype's parts (`--parts`: the inverse skipped; the loads and three products alone), timed at
#      HV64 and alone on an SM: where a prep program's latency goes. On an H100 at 5401f53: 0.996 / 0.614 / 0.352
#      ms at 168 registers, 8.0 / 5.7 / 3.7 us alone (results/gluon_prep_proto_parts_h100_5401f53.json).
#  28. The prototype's vectors kept in the layouts that use them (`--vectors 1`: g and beta loaded again as columns,
#      the cumulative gates as masked tile sums, no scan; `--vectors 2`: only beta's columns loaded): their parts
#      against the scan's form, at 168 registers and uncapped, outputs compared with form 0's. Offline (sm_90):
#      21 / 26 barriers against 28, 2712 / 2104 instructions against 1936, 48 B of stack at 168 (255 / 234
#      registers uncapped). On an H100 at f849bff (unswizzled scratch): form 2 0.5 us shorter alone, equal in
#      throughput; form 1 longer on both (results/gluon_prep_parts_vectors_h100_f849bff.json).
#  29, 30. (Ran on an H200 at da76e4d and an H100 at 12b07d8.) The fused prefill's prototype and its DEEP form
#      (perf-history, 2026-12-06): the prototype became kernels/gluon/delta_fused.py (0d2edaf).
#  31. Issue 21: the fused prefill (kernels/gluon/delta_fused.py): its GPU tests (against the twin, the oracle and
#      the flagged token loop, a state cache), then `benchmarks/gpu_fused_prefill.py` (fused against the twin in one
#      process over the pairs around the planner's bound, two varlen batches, a serving batch). On an H100 at
#      1d915c3: the cache tests failed on the test's own NaN (an empty request's RMS); fixed, all 12 passed and the GPU
#      suite with the cache form planned (243 passed); 1.13-1.29x at 128 to 512 pairs, 0.79x at 64, 0.89x for a
#      batch whose one sequence holds 3/4 of the tokens (results/gpu_fused_prefill_h100_1d915c3.json).
#  32, 33. (Ran on an H100 at f8e58fa.) The barrier patch (ff31439's benchmarks/pending/): its GPU tests passed;
#      the chunk vectors' pass with every load first kept (HV64 0.117 ms against 0.170), the sweeps' tile barriers
#      and the fused prep's four buffers dropped (slower; within noise). Perf-history, 2026-12-06, f8e58fa.
#  34. Issue 19's cold row with the backward as a training step takes it (`loss.backward()` on a scalar loss, which
#      does not pay torch's sympy import that `autograd.grad` given grad_outputs pays, ~2 s), two fresh processes a
#      checkpoint mode: `benchmarks/gpu_delta_cold.py --scalar-loss`. On an H100 at f8e58fa: 4.9-5.8 s.
#  35. (Ran at 2295218 on an H100: its 4 tests passed, B1 T16384 0.497 ms against 0.522, T65536 1.806 against
#      1.854; results/ab_forward_specialised_h100_2295218.json.) The forward sweep warp-specialised with the WY
#      step against the package with its row off; the row is on since.
#  36. The figures of record on an H200 (none since ecf0925; the fused prefill's rows never there): the six prefill
#      workloads (ours alone; fla's figures of record are 0c5047c's) and issue 19's three training rows. On an
#      H100 at 0d7116d (the lead planned), at ce5ae1d (gpu_delta_train_h100_ce5ae1d.json) and, the prefill rows, at
#      b281a51 (results/gpu_chunk_delta_h100_b281a51.json).
#  39-41. (Ran at 6e59861 on an H100: both rows' tests passed, both slower, both off; perf-history, 2026-12-06,
#      6e59861.) The warp-specialised recompute and the one-pass warp-specialised forward.
#  42. (Ran at 6e59861 on an H100, the same entry.) The recompute beside the reverse sweep on the same SMs: right,
#      not faster (each 1.5-2x slower beside the other: together they are bound by memory bandwidth); backed out.
#  43. Issue 21's rows on the GPU's clock (`benchmarks/gpu_forward_timeline.py`, any card): how long the B1 row's first
#      phase's prep runs alone, the gaps at its phase boundaries (~8-10 us each by an earlier count), and the HV64
#      row's pass, fused kernel and token loop.
#  44. Issue 21's HV64 row under Nsight Compute: the fused kernel as planned (its stall reasons per instruction, each
#      pipe's use), to name what its prep and chains contend for on an SM (each holds the other back: a chunk 4.2 us
#      against 2.6-2.9 alone, at ~1 TB/s of memory traffic, so not the bandwidth).
#      A Gluon kernel under ncu once crashed the profiled process (the dq/dk twin): then the report is empty.
#  45. Issue 21: what the query's part of the prep costs (`benchmarks/gpu_prep_query_share.py`, any card): the prep
#      alone as planned, with the q tile for its norms alone (QUERY 1: no Q K^T, no aqk) and with no q (QUERY 0), at
#      the B1, HV64 and B4 rows. Whether the sweep's outputs warpgroups forming the delta rule's scores themselves
#      (as they do for simple GLA) would take enough off the prep to pay.
#  46. Issue 21: the B1 rows at other phase counts and ratios under the warp-specialised sweep
#      (`benchmarks/gpu_phase_counts.py`, any card; each against the planned shape in one process, bits compared).
#  47. Issue 21: the B1 rows whole with the prep at QUERY 2, 1 and 0 (`benchmarks/gpu_prep_query_share.py --rows`, any
#      card), at the planned and other phase shapes, and their sweep alone in one pass: how far the rows fall with the
#      query's part out of the prep, for free (the planned sweep reads stale aqk). B1 T16384 ran on an H100 at 998e499
#      with a wrong QUERY 0 (coef rows of 8 read as rows of 4: the replay ran; results/gpu_prep_query_rows_h100_998e499
#      .json, its QUERY 0 rows void); T65536 and QUERY 0 not yet run.
#  48. Issue 21: the chained schedule (DeltaShape.chained: the prep beside the warp-specialised sweep per chunk,
#      ready flags): its GPU tests (the bits over JIT, direct and graph launches; a sweep whose prep cannot run
#      beside it replaying), then only where they passed the B1 rows planned against chained
#      (`benchmarks/gpu_chained.py`, any card; graph replay and eager, bits compared), the prep at 128 registers,
#      and chained with a lead of 0.1-0.3 (DeltaShape.chained_lead: the first chunks' prep on every SM before the
#      sweep; plan.delta.CHAINED_LEAD), and a row of two sequences. The tests run both forms (lead 0 and 0.2).
#      On H100s at d0c9d6a, 0d7116d and ce5ae1d: the tests passed, lead 0.1 2-5% faster than none (planned since e2e258b),
#      0.2 and over slower, 128 registers slower (results/gpu_chained_h100_ce5ae1d.json). Not yet on an H200.
#  49. Issue 21's varlen rows (one sequence, T16384 / T65536, eager, within 5% of dense) with the chained schedule
#      planned (`benchmarks/gpu_varlen_one_sequence.py`, any card; a sequence alone runs as the dense batch). On an
#      H100 at 0d7116d, ce5ae1d and bf6abc9: 0.97-1.04x, the same bits (results/gpu_varlen_one_sequence_h100_bf6abc9.json).
#  50. Issue 21: the GPU's clocks and power while the B1 rows run (`benchmarks/gpu_clocks.py`, any card; nvidia-smi
#      sampled every 50 ms): the prep alone, the sweep alone and the planned chained row. Whether the prep's ~9% loss
#      beside the sweep is a clock (power) cap or contention on the chip; with --train, issue 19's training steps too.
#      On H100s at 27479d8 and ce5ae1d (with --train): the prep alone draws the 700 W cap at 1860-1890 MHz, the planned
#      rows hold the cap throughout (1920 / 1725 MHz median at T16384 / T65536), the training steps do not (552-596 W
#      at 1980 MHz; results/gpu_clocks_h100_ce5ae1d.json).
#  51. Issue 19: the delta reverse sweep's timing probes (`benchmarks/gpu_delta_reverse_probe.py`, any card, a process
#      a probe: 0, 1, 3, 6). On H100s at 22b7bad and 7dfd9cf: the chain alone 1.0-1.6 us a chunk of 2.85-3.2, half the
#      rest the dS, dY and dv stores (results/gpu_delta_reverse_probe_h100_22b7bad.json, _stores_h100_7dfd9cf.json).
#  52. (Ran at d10dba8 on an H100.) The fused prefill's chains taking turns on the tensor pipe (FA3's ping-pong; slower
#      in every form, taken out) and U^T staged in a buffer of its own (0.2-1.8% faster, the same bits; the kernel's form
#      since): results/ab_fused_{turns1,turns2,turns3,u_buffer,u_buffer_repeat}_h100_d10dba8.json. The fused kernel's 12
#      GPU tests passed in that form at 4fd213f on an H100 (results/gpu_tests_fused_h100_4fd213f.log).
#  53, 54. (Ran at ef165d9 on an H100; both taken out.) The Gluon reverse sweep's stores staged in two buffers each
#      beside a ring of two stages: the same bits (3 tests), the sweep 751 us against 754 at B1 T16384 HV32 and 204
#      against 208 at B4 (two stages alone 203 against 206): results/gpu_delta_train_{buffers2_stages2,stages2}_b{1,4}_
#      h100_ef165d9.json. The fused prefill's chains with S^T and U^T as register operands on 192 registers, its prep
#      on 104: the same bits (6 tests), 3-7% slower at HV64 and varlen16 (results/ab_fused_register_operands_h100_
#      ef165d9.json).
#  55. (Ran at 2a2484f on an H100, the branch exp/fused-deep-ring, not in main.) The register split on a ring of
#      three stages: the same bits (6 tests), 5-10% slower than the planned form (results/ab_fused_deep_ring_h100_
#      2a2484f.json).
#  56. (Ran at 35f37ce on an H100.) The chunk vectors' pass in other forms (`benchmarks/chunk_vectors_forms.py`):
#      the package's kernel 104-109 us at HV64 at 2, 4 and 8 warps, the looped forms (a run of chunks a program,
#      loads pipelined) ~3x slower (results/chunk_vectors_forms_h100_35f37ce.json); 500cce2's package form not pursued.
#  58. (Ran at 35f37ce on an H100; taken out.) The fused prep handing aqk over after wy (FUSED_AQK_LATE 1 and 2):
#      the same bits (10 tests), 0.7-2% slower on both rows (results/ab_fused_aqk_late{1,2}_h100_35f37ce.json).
#  59. Issue 21: the fused kernel's timing probes (`benchmarks/gpu_fused_probe.py`, any card; each probe in a
#      process of its own). Ran at 35f37ce on an H100 with the prep inverting its own diagonal blocks
#      (results/gpu_fused_probe_h100_35f37ce.json): the period follows the prep's path, ~1.6 ns an instruction.
#      Not since d5f3551 (the prep's loop 915 -> 736 instructions took only ~0.04 us off a chunk): run again with
#      probe 5 (no chain work: the prep's and the loads' period alone, built at 4a68dd1, not yet run).
#  60. Issue 21: the fused prep given the WY inverse's diagonal blocks by the chunk vectors' pass
#      (plan.delta.FUSED_DIAGONAL_FROM_PASS, planned since; any card): its GPU tests, then the rows with the switch
#      against the previous commit's package (build/prev as step 56 said; with it planned, pass
#      --plan FUSED_DIAGONAL_FROM_PASS=False to see the other form). Ran at 35f37ce on an H100
#      (results/ab_fused_diagonal_pass{,_repeat}_h100_35f37ce.json). Its tests ran again at a4ba5b6 (the pass
#      reading the keys once) and 55c8293 (the prep's path with the blocks given): 17 and 19 passed on H100s
#      (results/gpu_tests_fused_keys_once_h100_a4ba5b6.log, gpu_tests_fused_h100_55c8293.log).
#  61. (Ran at a4ba5b6 on an H100.) The chunk vectors' pass in its forms with the diagonal inverses
#      (`benchmarks/ab_chunk_vectors.py --prev build/prev --dinv --maxnreg 96 --num-warps 8`, every package in
#      build/prev a form): the keys read once 133 us against 170 at HV64 (results/ab_chunk_vectors_pass_forms_dinv_
#      h100_a4ba5b6.json).
#  62-65. Issue 19, on the branch exp/dqdk (check it out first; its pending_gpu.sh has the steps): dq and dk's
#      Gluon twin in four steps built offline (perf-history, 2026-12-08, exp/dqdk): its GPU tests (62), its
#      timing probes (63), each step timed as a package beside main's (64 GDN, 65 GDP). Not yet run.
#  66. Issue 21, on the branch exp/fused-pipelined (check it out first; its pending_gpu.sh has the step): the fused
#      prefill with its chains at 184 registers and its prep at 120, where ptxas pipelines its wgmmas (main's split
#      serialises every one, C7512): its GPU tests, the rows against main's package, its probes. Not yet run.
#      The branch exp/next merges both branches with main: check it out once, carry build/prev (main's package as
#      recurscan_prev, 1caa89a's as recurscan_rows, exp/next's own as recurscan_off) and build/main (main's alone),
#      and run `pending_gpu.sh 62`, `64`, `67` (one call each; the rest of the budget: `63`, `65`; 66 is superseded by
#      67, and exp/next holds 67 too).
#  67. Issue 21 (main): plan.delta.FUSED_PIPELINED, the fused prefill's split where ptxas pipelines its wgmmas
#      (chains 184, the prep 120 in its PIPELINED form: one [64, 64] product at a time; offline no spills in any
#      form), off until measured. Its GPU tests (unproven), then the HV64 and varlen16 rows with it on against main's
#      package as planned (build/main: main's package as recurscan_prev; the switch is this tree's alone), then its
#      probes 0, 4 (no prep work: the chains' pipelined period) and 5 (no chain work) with it on.
#      Supersedes 66 (the branch's split spills 48 B). Not yet run.
# Arguments: the steps to run (default: 0 7 3), each set fits one 600 s call.
set -u
STEPS=${*:-0 7 3}
step() { [[ " $STEPS " == *" $1 "* ]]; }
C=${RECURSCAN_COMMIT:-unknown}
export RECURSCAN_COMMIT=$C
# PLAN="NAME=VALUE ...": planner values set for steps 36 and 49 (runner.set_plan; recorded in their files'
# environment as plan_set), e.g. PLAN=CHAINED_LEAD=0.2 to measure a value before it is planned.
PLANS=""; for p in ${PLAN:-}; do PLANS="$PLANS --plan $p"; done
pip install -q --no-index --no-deps --target /tmp/site .whl/fla_core-0.6.0-py3-none-any.whl 2>&1 | grep -v WARNING | tail -1
[ -f .whl/mamba_ssm-2.3.2.post1.tar.gz ] && mkdir -p /tmp/mamba && tar xzf .whl/mamba_ssm-2.3.2.post1.tar.gz -C /tmp/mamba --strip-components=1
WORKERS=$(python -c "import torch; print(6 if torch.cuda.get_device_properties(0).total_memory > 100e9 else 4)")
step 0 && { timeout 500 python -m pytest -m "gpu and not unproven" -n "$WORKERS" tests/gpu -p no:cacheprovider -o faulthandler_timeout=490 -q \
    tests/test_hardening_gradients.py::test_an_unread_output_is_a_zero_cotangent \
    > "$OUT/gpu_tests_$C.log" 2>&1; echo "gpu suite rc=$?"; grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_$C.log" | tail -12; }
W=tma:grp:gluon:ws
RUN="env PYTHONPATH=$PWD:/tmp/site MAMBA_SSM_SRC=/tmp/mamba python benchmarks/gpu_gla_sweep.py --profile"
step 1 && timeout 170 $RUN \
    --sweep 64:4:3:$W:gh32:pw8:reg0 --sweep 64:4:3:$W:gh32 --sweep 64:4:3:$W:pw8:reg0 \
    --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -60
step 4 && timeout 90 env RECURSCAN_SWEEP_COEF_PREFETCH=0 $RUN --out "$OUT/gpu_gla_sweep_no_prefetch_$C.json" 2>&1 \
    | grep -v Warning | grep -E " ms" | head -30
step 7 && timeout 150 $RUN --sweep 64:4:3:tma:qk:gluon:ws:pw8 --out "$OUT/gpu_gla_sweep_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -30
step 3 && timeout 110 env PYTHONPATH=$PWD python benchmarks/gpu_gla_cold_ab.py \
    --forms "planned,planned with torch's import first" --times 2
step 2 && timeout 100 env PYTHONPATH=$PWD python benchmarks/train_mamba2_mixer.py --out "$OUT/train_mamba2_mixer" 2>&1 | tail -4
step 5 && timeout 200 $RUN --train-only --out "$OUT/gpu_gla_train_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -20
step 6 && timeout 90 env PYTHONPATH=$PWD python benchmarks/gpu_transformers_mamba2.py \
    --out "$OUT/gpu_transformers_mamba2_$C.json" 2>&1 | tail -4
step 5 && timeout 100 env RECURSCAN_SWEEP_COEF_PREFETCH=0 $RUN --train-only \
    --out "$OUT/gpu_gla_train_no_prefetch_$C.json" 2>&1 | grep -v Warning | grep -E " ms" | head -20
# Steps 8 and 9: each warp-specialised form measured only where its own GPU tests passed (a hang in
# a kernel never run before then costs its tests' time limit alone). Step 8 leaves the forms that
# passed in /tmp/recurscan_unproven_ok (the machine keeps it while warm) for step 9.
unproven_tests() {  # $1: a name, $2: pytest -k expression, $3: seconds
    timeout "$3" python -m pytest -m "gpu and unproven" tests/gpu -k "$2" -p no:cacheprovider -q -rA \
        > "$OUT/gpu_tests_unproven_$1_$C.log" 2>&1
    local rc=$?; echo "unproven $1 tests rc=$rc"; tail -3 "$OUT/gpu_tests_unproven_$1_$C.log"; return $rc
}
forms() {  # the --gluon arguments: the planned twins with each form that passed, and with all of them
    local twins=gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores all="" f
    for f in $(cat /tmp/recurscan_unproven_ok 2>/dev/null); do echo "--gluon $twins+$f"; all="$all+$f"; done
    [ "$(wc -w < /tmp/recurscan_unproven_ok)" -gt 1 ] && echo "--gluon $twins$all"
}
train() {  # $1: workload, $2: seconds, $3: the file's tag
    [ -s /tmp/recurscan_unproven_ok ] || { echo "no form passed its tests: nothing to measure"; return; }
    timeout "$2" env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan --profile \
        --workload "$1" $(forms) --out "$OUT/gpu_delta_train_specialised_$3_$C.json" 2>&1 | grep -v Warning | tail -30
}
step 8 && {
    : > /tmp/recurscan_unproven_ok
    unproven_tests dqdk "warp_specialised_dq_dk or (other_head_sizes and gluon_dqdk_specialized)" 170 \
        && echo gluon_dqdk_specialized >> /tmp/recurscan_unproven_ok
    unproven_tests both "non_finite or planner" 70
    train gdn_b4_t4096_h16 170 b4
}
step 9 && train gdn_b1_t16384_h16_hv32 420 b1
step 10 && { timeout 400 python -m pytest -m gpu -n "$WORKERS" tests/test_hardening_gradients.py -p no:cacheprovider -q \
    -o faulthandler_timeout=390 > "$OUT/gpu_tests_hardening_gradients_$C.log" 2>&1; echo "gradients hardening rc=$?"
    grep -E "passed|failed|FAILED|Timeout" "$OUT/gpu_tests_hardening_gradients_$C.log" | tail -12; }
step 11 && for first in "" --torch-import-first; do timeout 200 env PYTHONPATH=$PWD python benchmarks/gpu_delta_cold.py \
    --runs 2 $first --out "$OUT/gpu_delta_cold${first:+_torch_import_first}_$C.json" 2>&1 | grep -E "cold first call"; done
step 13 && {
    : > /tmp/recurscan_unproven_ok
    unproven_tests gdp_sweep "gluon_reverse_sweep_for_gdp" 200 && echo gdp_sweep >> /tmp/recurscan_unproven_ok
    timeout 150 python -m pytest -m "gpu and not unproven" tests/gpu/test_delta_grad_gpu.py -p no:cacheprovider -q \
        -k "gluon_scores_kernel or (other_head_sizes and gluon_scores) or non_finite or planner_gives or gdp_gradients" \
        > "$OUT/gpu_tests_scores_$C.log" 2>&1; echo "scores tests rc=$?"; tail -3 "$OUT/gpu_tests_scores_$C.log"
    timeout 150 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan --profile \
        --workload gdp_m2_b4_t4096_h16 --gluon gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores \
        --out "$OUT/gpu_delta_train_gdp_$C.json" 2>&1 | grep -v Warning | tail -30
}
step 14 && {
    : > /tmp/recurscan_unproven_ok
    unproven_tests dqdk "warp_specialised_dq_dk or (other_head_sizes and gluon_dqdk_specialized)" 170 \
        && echo gluon_dqdk_specialized >> /tmp/recurscan_unproven_ok
    train gdn_b4_t4096_h16 150 b4
    train gdn_b1_t16384_h16_hv32 200 b1
}
step 12 && timeout 150 python -m benchmarks.diag_dqdk_specialised --out "$OUT/diag_dqdk_specialised_$C.json" 2>&1 \
    | grep -E "twice|^[A-Za-z]" | head -20
step 16 && { GDN_TWINS=gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores
    timeout 200 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan --profile \
        --workload gdp_m2_b4_t4096_h16_k64 --gluon $GDN_TWINS+gdp_sweep \
        --gluon $GDN_TWINS+gdp_sweep+gdp_dqdk --out "$OUT/gpu_delta_train_gdp_k64_$C.json" 2>&1 | grep -v Warning | tail -40
}
step 18 && unproven_tests non_finite "non_finite or gluon_dq_dk_kernel_for_gdp" 200
step 19 && timeout 300 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan \
    --profile --dqdk-stages 4 --out "$OUT/gpu_delta_train_dqdk_stages_$C.json" 2>&1 | grep -v Warning | grep -v warn_once \
    | grep -E "fwd\+bwd|dqdk" | head -20
step 17 && { T=gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores
    timeout 200 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan --profile \
        --workload gdn_b4_t4096_h16_k64 --gluon ${T/gluon_dqdk+/} --gluon ${T/gluon_sweep+/} \
        --gluon ${T/+gluon_scores/} --gluon forward_sweep --out "$OUT/gpu_delta_train_gdn_k64_$C.json" 2>&1 \
        | grep -v Warning | grep -v warn_once | tail -40
}
step 15 && {
    : > /tmp/recurscan_unproven_ok
    timeout 240 python -m pytest -m gpu tests/gpu -k "gluon_dq_dk_kernel_for_gdp or gluon_reverse_sweep_for_gdp" \
        -p no:cacheprovider -q -rA > "$OUT/gpu_tests_gdp_twins_$C.log" 2>&1 && echo gdp_dqdk >> /tmp/recurscan_unproven_ok
    echo "GDP twin tests rc=$?"; tail -3 "$OUT/gpu_tests_gdp_twins_$C.log"
    timeout 120 python -m pytest -m "gpu and not unproven" tests/gpu/test_delta_grad_gpu.py -p no:cacheprovider -q \
        -k "gluon_dq_dk_kernel_agrees" > "$OUT/gpu_tests_dqdk_twin_$C.log" 2>&1; echo "dq/dk twin tests rc=$?"
    tail -3 "$OUT/gpu_tests_dqdk_twin_$C.log"
    PLANNED=gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores+gdp_sweep
    [ -s /tmp/recurscan_unproven_ok ] && timeout 150 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py \
        --impl recurscan --profile --workload gdp_m2_b4_t4096_h16 --gluon $PLANNED+gdp_dqdk \
        --out "$OUT/gpu_delta_train_gdp_dqdk_$C.json" 2>&1 | grep -v Warning | tail -30
    [ -d build/prev ] && timeout 120 env PYTHONPATH=$PWD:/tmp/site python benchmarks/gpu_delta_train.py --impl recurscan \
        --impl prev --prev build/prev --profile --workload gdn_b4_t4096_h16 \
        --out "$OUT/gpu_delta_train_b4_vs_prev_$C.json" 2>&1 | grep -v Warning | tail -30
}
step 20 && {
    : > /tmp/recurscan_unproven_ok
    unproven_tests gdp_scores "gluon_scores_kernel_for_gdp or non_finite_input_of_one_gdp" 240 \
        && echo gdp_scores >> /tmp/recurscan_unproven_ok
    unproven_tests dqdk_stages "ring_of_four_stages" 150 && echo dqdk_stages >> /tmp/recurscan_unproven_ok
}
step 21 && {
    grep -q gdp_scores /tmp/recurscan_unproven_ok && timeout 150 env PYTHONPATH=$PWD:/tmp/site python \
        benchmarks/gpu_delta_train.py --impl recurscan --profile --workload gdp_m2_b4_t4096_h16 \
        --gluon gluon_sweep+gluon_dqdk+forward_sweep+gluon_scores+gdp_sweep+gdp_dqdk+gdp_scores \
        --out "$OUT/gpu_delta_train_gdp_scores_$C.json" 2>&1 | grep -v Warning | grep -v warn_once | tail -20
    grep -q dqdk_stages /tmp/recurscan_unproven_ok && timeout 200 env PYTHONPATH=$PWD:/tmp/site python \
        benchmarks/gpu_delta_train.py --impl recurscan --profile --dqdk-stages 4 \
        --out "$OUT/gpu_delta_train_dqdk_stages_$C.json" 2>&1 | grep -v Warning | grep -v warn_once \
        | grep -E "fwd\+bwd|dqdk" | head -20
}
step 24 && {
    timeout 150 python -c "import sys, pytest, recurscan.plan.delta as d; d.PREP_SPLIT_INVERSE = 16; sys.exit(pytest.main(
        ['-q', '-x', '-m', 'gpu', 'tests/gpu/test_chunk_delta_gpu.py', '-p', 'no:cacheprovider', '-k',
         'split_inverse or benchmark_shape or gdp_varlen or t65536 or float32 or phases']))" 2>&1 | tail -3
    for split in ${SPLITS:-16 32}; do
        timeout 200 env PYTHONPATH=$PWD:/tmp/site python -m benchmarks.ab_prev --prev build/base --label 7302e8b \
            --plan PREP_SPLIT_INVERSE=$split --workload gdn_b1_t16384_h16_hv32 --workload gdn_b4_t8192_h16_hv64 \
            --workload gdp_m2_b4_t4096_h16 --kernels --rep-ms 300 --out "$OUT/ab_split_inverse_${split}_$C.json" 2>&1 \
            | grep -v Warn | grep -E "ours|prep" | tail -20
    done
}
step 26 && timeout 240 env PYTHONPATH=$PWD python benchmarks/gluon_prep_proto.py --out "$OUT/gluon_prep_proto_$C.json" 2>&1 \
    | grep -v Warning | tail -8
step 27 && timeout 200 env PYTHONPATH=$PWD python benchmarks/gluon_prep_proto.py --parts --maxnreg 168 --maxnreg 0 \
    --out "$OUT/gluon_prep_proto_parts_$C.json" 2>&1 | grep -v Warning | tail -8
step 28 && timeout 200 env PYTHONPATH=$PWD python benchmarks/gluon_prep_proto.py --parts --maxnreg 168 --maxnreg 0 \
    --vectors 0 --vectors 1 --vectors 2 --out "$OUT/gluon_prep_parts_vectors_$C.json" 2>&1 | grep -v Warning | tail -12
step 31 && { timeout 240 python -m pytest -m gpu tests/gpu/test_fused_prefill_gpu.py -q -rfE -p no:cacheprovider 2>&1 \
    | grep -v Warning | tail -25;
    timeout 240 env PYTHONPATH=$PWD python benchmarks/gpu_fused_prefill.py --out "$OUT/gpu_fused_prefill_$C.json" 2>&1 \
    | grep -v Warning | tail -10; }
step 34 && timeout 150 env PYTHONPATH=$PWD python benchmarks/gpu_delta_cold.py --runs 2 --scalar-loss \
    --out "$OUT/gpu_delta_cold_scalar_loss_$C.json" 2>&1 | grep -E "cold first call"
step 36 && { timeout 250 env PYTHONPATH=$PWD python -m benchmarks.gpu_chunk_delta --only workloads --no-fla $PLANS \
    --out "$OUT/gpu_chunk_delta_$C.json" 2>&1 | grep -v Warning | tail -8
    timeout 250 env PYTHONPATH=$PWD python benchmarks/gpu_delta_train.py --impl recurscan --workload gdn_b4_t4096_h16 \
    --workload gdn_b1_t16384_h16_hv32 --workload gdp_m2_b4_t4096_h16 --profile $PLANS --out "$OUT/gpu_delta_train_$C.json" \
    2>&1 | grep -v Warning | grep "fwd+bwd"; }
step 43 && timeout 200 python -m benchmarks.gpu_forward_timeline --workload gdn_b1_t16384_h16_hv32 \
    --workload gdn_b4_t8192_h16_hv64 --workload gdn_b4_t4096_h16 --out "$OUT/gpu_forward_timeline_$C.json" 2>&1 \
    | grep -v -i warn | head -120
step 44 && { timeout 300 ncu --clock-control none --nvtx --nvtx-include "profiled/" --set detailed --import-source yes \
    -k regex:fused_prefill -o /tmp/prof_fused python -m benchmarks.ncu_chunk_delta gdn_b4_t8192_h16_hv64 planned \
    > /dev/null 2>&1; echo "ncu rc=$?"
    ncu -i /tmp/prof_fused.ncu-rep --page details > "$OUT/ncu_details_fused_hv64_$C.txt" 2>&1
    ncu -i /tmp/prof_fused.ncu-rep --page source --csv --print-source sass > /tmp/sass.csv 2>/dev/null && \
        python -m benchmarks.ncu_stalls /tmp/sass.csv 25 > "$OUT/ncu_fused_hv64_$C.txt" 2>&1
    head -40 "$OUT/ncu_fused_hv64_$C.txt"; }
step 45 && timeout 240 env PYTHONPATH=$PWD python -m benchmarks.gpu_prep_query_share \
    --out "$OUT/gpu_prep_query_share_$C.json" 2>&1 | grep -v -i warn | tail -14
step 47 && timeout 400 env PYTHONPATH=$PWD python -m benchmarks.gpu_prep_query_share --rows --rep-ms 100 \
    --out "$OUT/gpu_prep_query_rows_$C.json" 2>&1 | grep -v -i warn | tail -40
step 48 && { timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -o faulthandler_timeout=190 \
    tests/gpu/test_gluon_sweep_gpu.py -k "chained" > "$OUT/gpu_tests_chained_$C.log" 2>&1; rc=$?
    echo "chained tests rc=$rc"; grep -E "passed|failed|FAILED|Error|Timeout" "$OUT/gpu_tests_chained_$C.log" | tail -12
    [ $rc -eq 0 ] && timeout 240 env PYTHONPATH=$PWD python -m benchmarks.gpu_chained --rep-ms 100 \
        --out "$OUT/gpu_chained_$C.json" 2>&1 | grep -v -i warn | tail -12; }
step 50 && timeout 150 env PYTHONPATH=$PWD python -m benchmarks.gpu_clocks --train --out "$OUT/gpu_clocks_$C.json" \
    2>&1 | grep -v -i warn | tail -8
step 51 && timeout 300 env PYTHONPATH=$PWD python benchmarks/gpu_delta_reverse_probe.py \
    --out "$OUT/gpu_delta_reverse_probe_$C.json" 2>&1 | grep "^probe"
step 56 && timeout 300 env PYTHONPATH=$PWD python -m benchmarks.chunk_vectors_forms \
    --out "$OUT/chunk_vectors_forms_$C.json" 2>&1 | grep -v -i warn | tail -30
step 59 && timeout 300 env PYTHONPATH=$PWD python benchmarks/gpu_fused_probe.py --out "$OUT/gpu_fused_probe_$C.json" \
    2>&1 | grep "^probe"
step 60 && { timeout 240 python -m pytest -m gpu -q -p no:cacheprovider -o faulthandler_timeout=230 \
    tests/gpu/test_fused_prefill_gpu.py -k "diagonal_blocks or oracle or varlen" > "$OUT/gpu_tests_fused_diagonal_pass_$C.log" 2>&1; rc=$?
    echo "diagonal-pass tests rc=$rc"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_fused_diagonal_pass_$C.log" | tail -8
    [ $rc -eq 0 ] && timeout 170 env PYTHONPATH=$PWD python -m benchmarks.ab_prev --prev build/prev --label prev \
        --workload gdn_b4_t8192_h16_hv64 --workload gdn_varlen16_32976_hv32 --rep-ms 300 --kernels \
        --plan FUSED_DIAGONAL_FROM_PASS=True --out "$OUT/ab_fused_diagonal_pass_$C.json" 2>&1 | grep -v -i warn | tail -14; }
step 67 && { unproven_tests fused_pipelined "pipelined_form" 200
    [ $? -eq 0 ] && timeout 170 env PYTHONPATH=$PWD python -m benchmarks.ab_prev --prev build/main --label main \
        --workload gdn_b4_t8192_h16_hv64 --workload gdn_varlen16_32976_hv32 --rep-ms 300 --kernels \
        --plan FUSED_PIPELINED=True --out "$OUT/ab_fused_pipelined_$C.json" 2>&1 | grep -v -i warn | tail -14
    timeout 180 env PYTHONPATH=$PWD python benchmarks/gpu_fused_probe.py --plan FUSED_PIPELINED=True --probe 0 \
        --probe 4 --probe 5 --out "$OUT/gpu_fused_probe_pipelined_$C.json" 2>&1 | grep "^probe"; }
step 49 && timeout 150 env PYTHONPATH=$PWD python benchmarks/gpu_varlen_one_sequence.py $PLANS \
    --out "$OUT/gpu_varlen_one_sequence_$C.json" 2>&1 | grep -v -i warn | tail -8
step 46 && timeout 200 env PYTHONPATH=$PWD python -m benchmarks.gpu_phase_counts --out "$OUT/gpu_phase_counts_$C.json" \
    2>&1 | grep -v -i warn | tail -30
step 22 && timeout 120 env PYTHONPATH=$PWD python benchmarks/gpu_prep_latency.py --out "$OUT/gpu_prep_latency_$C.json" 2>&1 \
    | grep -v Warning | tail -6
step 23 && timeout 150 env PYTHONPATH=$PWD python benchmarks/inverse_forms.py --items 132 --items 8192 --items 32768 \
    --num-warps 4 --num-warps 8 \
    --out "$OUT/inverse_forms_$C.json" 2>&1 | grep -v Warning | tail -30
