"""Which cluster tests run in the 1.36 tier, and which files start first in every cluster tier.

The 1.36 tier (``make test-136``: the same tests on a stock 1.36 control
plane, GPUSLICE_KUBE_VERSION=1.36). Not every test: the tier's promise is that each mode and each
guarantee gpuslice makes holds on stock 1.36, and the full tier runs on 1.37. Chosen to be short:
one test for each of what issue 45 names, the ones whose 1.36 behaviour differs most (counter sets
the 1.36 allocator handles, taints on devices where no DeviceTaintRule is served). A test that runs on
both GPU backends (``GPU_BACKENDS``) is in it on the fake one only: the mock NVML library's variant tests
the agent's NVML backend, which 1.36 does not change."""

from __future__ import annotations

K136: tuple[str, ...] = (
    # Stock: the release as shipped; every example Ready, a pod of each example's mode, no failed reconcile.
    "tests/cluster/stock/test_stock.py::test_the_control_plane_is_the_stock_release",
    "tests/cluster/stock/test_stock.py::"
    "test_every_example_is_ready_within_60s_and_runs_a_pod_of_its_mode_with_no_failed_reconcile",
    # A pod of each mode on its slice: memory, shared, dynamic MIG, MPS (static MIG: the stock test above).
    "tests/cluster/plugin/test_prepare.py::test_memory_slice_pod_runs_and_its_container_knows_its_slice",
    "tests/cluster/plugin/test_prepare.py::test_shared_capacity_pod_gets_its_share_as_the_memory_limit",
    "tests/cluster/plugin/test_prepare.py::test_dynamic_mig_pod_gets_an_instance_made_at_its_placement_and_destroyed_after",
    "tests/cluster/plugin/test_mps.py::test_one_daemon_per_gpu_and_namespace_with_each_containers_limits",
    # Counter sets as the 1.36 allocator reads them; a drain (a resize held by claims); taints on the devices.
    "tests/cluster/agent/test_publishing.py::test_nine_pods_on_an_h100_sliced_in_10g_eight_fit",
    "tests/cluster/agent/test_publishing.py::test_resize_while_claims_hold_slices_waits_for_them",
    "tests/cluster/agent/test_publishing.py::test_policy_taints_travel_on_its_devices_and_reach_allocated_ones_at_once",
    # A health taint: the scheduler stops allocating, the pod's status says so, the taint lifts.
    "tests/cluster/plugin/test_health.py::test_unhealthy_gpu_is_tainted_shown_in_the_pod_status_and_recovers",
    # Tenancy refusals and limits, as a hostile tenant tries them.
    "tests/cluster/controller/test_tenancy.py::test_tenant_claims_admitted_others_denied_with_policy_message",
    "tests/cluster/controller/test_tenancy.py::test_tenants_may_not_tolerate_gpuslices_taints",
    "tests/cluster/controller/test_tenancy.py::test_quota_rejects_the_claim_beyond_max_slices",
    # maxMemory under a rush (partitionable slices and whole GPUs).
    "tests/cluster/webhook/test_max_memory_rush.py::test_a_rush_of_slices_and_whole_gpus_never_takes_more_than_max_memory",
    # status and why.
    "tests/cluster/inspect/test_status.py::test_the_map_shows_each_pods_slice_and_the_totals_the_policy_counts",
    "tests/cluster/inspect/test_why.py::test_over_the_limit_by_how_much",
    "tests/cluster/inspect/test_why.py::test_slices_kept_off_by_a_maintenance_taint",
)


# Files that take a minute or more (seconds of their slowest tests, measured with 3 workers on 2 cores,
# 2026-12-06), started first, longest first: the workers take whole files (``--dist loadfile``), and a
# long file started last is a tail one worker runs alone (xdist's own order, most tests first, left the
# bench's one six-minute test to the end). Every other file follows, most tests first.
LONG_FILES: tuple[str, ...] = (
    "tests/cluster/bench/test_bench_smoke.py",  # 374 s
    "tests/cluster/plugin/test_transitions.py",  # 224 s
    "tests/cluster/faults/test_restarts.py",  # 174 s
    "tests/cluster/controller/test_quiet_at_scale.py",  # 119 s
    "tests/cluster/webhook/test_webhook_certs.py",  # 118 s
    "tests/cluster/controller/test_agent_views.py",  # 118 s
    "tests/cluster/webhook/test_forged_reviews.py",  # 113 s
    "tests/cluster/controller/test_scheduler_retry_per_pod.py",  # 112 s
    "tests/cluster/plugin/test_defrag_role_moves_only_for_a_waiting_pod.py",  # 109 s
    "tests/cluster/plugin/test_defrag.py",  # 78 s
    "tests/cluster/controller/test_retry_holds_with_poison_pods_churned_across_namespaces.py",  # 71 s
    "tests/cluster/podrunner/test_pod_runner.py",  # 71 s
    "tests/cluster/plugin/test_static_mig.py",  # 67 s
    "tests/cluster/webhook/test_a_review_charges_a_waiting_claim_no_more_than_it_asks.py",  # 62 s
)
