"""The submit-follow-delete loop of a multi-node train step (components/train/jobs.py), through
the real `kubernetes` client against a loopback API server that records every request
(tests/support/fake_kube.py): leftovers, creation, status, pods, logs, failures, cancels, retries of
the API, and the failure markers the other stages' workers read."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import time

import pytest

from components.core.commit import OutputDir
from components.core.config import RunConfig
from components.core.errors import StageError
from components.core.layout import RunLayout, store_for
from components.train import jobs, jobspec, jobstatus
from components.train import kube as kube_api
from tests.support.cluster import SEGMENT_ARGS, cluster_cfg
from tests.support.fake_kube import FakeKube


def _pod(name: str, phase: str, terminated: dict | None = None) -> dict:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {
        "metadata": {"name": name},
        "status": {"phase": phase, "containerStatuses": [{"name": "node", "state": state}]},
    }


def _commit_checkpoints(cfg: RunConfig, iterations) -> None:
    store, layout = store_for(cfg), RunLayout.of(cfg)
    for i in iterations:
        out = OutputDir(store, layout.checkpoint(i + 1), "train")
        out.begin()
        out.put_bytes(b"{}", "config.json")
        out.commit({"train/loss": 0.5 + i})


def _commits_as_it_runs(kube: FakeKube, cfg: RunConfig, iterations) -> None:
    """Rank 0 commits the step's checkpoints while the job runs (at the task's first poll)."""

    def commit() -> None:
        kube.on_poll = lambda: None
        _commit_checkpoints(cfg, iterations)

    kube.on_poll = commit


def _run_on_a_fake_clock(cfg: RunConfig, kube: FakeKube) -> dict:
    """run_job with no real waiting: each poll is 100 s later than the last (timers elapse)."""
    clock = iter(range(0, 100_000, 100))
    return jobs.run_job(
        cfg,
        SEGMENT_ARGS,
        api_client=kube.client(),
        out=io.StringIO(),
        sleep=lambda _: None,
        monotonic=lambda: next(clock),
    )


RUNNING = {"conditions": [{"type": "Created", "status": "True"}]}
COMPLETE = {
    "conditions": [
        {"type": "Created", "status": "True"},
        {
            "type": "Complete",
            "status": "True",
            "reason": "JobSetCompleted",
            "message": "jobset completed successfully",
        },
    ]
}
FAILED = {
    "conditions": [
        {
            "type": "Failed",
            "status": "True",
            "reason": "JobSetFailed",
            "message": "jobset failed: job node-1 has failed",
        }
    ]
}


#: a node pod the scheduler cannot place
PENDING = {
    "metadata": {"name": "j-node-0-1"},
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu",
            }
        ],
    },
}


@pytest.fixture
def in_pod(monkeypatch, tmp_path):
    """The task's pod: its hostname, and its namespace in the service account's file (this
    test's own, whatever pod the tests themselves run in); the file is returned."""
    monkeypatch.setenv("HOSTNAME", "task-pod-7")
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    monkeypatch.delenv("KFP_POD_UID", raising=False)
    own = tmp_path / "pod-namespace"
    own.write_text("default")
    monkeypatch.setattr(kube_api, "NAMESPACE_FILE", str(own))
    return own


def test_submit_follow_and_delete_a_trainjob(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    cfg.cluster.train_job.namespace = "team-a"
    in_pod.write_text("team-a")  # the task's pod runs there too: it owns the job
    pods = [_pod("j-node-0-0", "Running"), _pod("j-node-0-1", "Running")]
    kube = FakeKube(
        [RUNNING, RUNNING, COMPLETE],
        pods,
        {"j-node-0-0": ["rank 0 up", "train 00004: loss 0.5"], "j-node-0-1": ["rank 1 up"]},
    )
    _commits_as_it_runs(kube, cfg, range(4, 8))
    out = io.StringIO()
    result = jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=out)

    name = kube.created()
    assert re.fullmatch(
        rf"rlvr-train-demo-run-7-{jobspec.step_key(cfg, SEGMENT_ARGS)[:8]}-"
        r"[0-9a-f]{5}",
        name,
    )
    assert result == {
        "task": "train",
        "segment": 1,
        "steps": 4,
        "job": name,
        "nodes": 2,
        "processes_per_node": 8,
    }
    # first: are there leftovers of this step? (none)
    assert kube.requests[0][:3] == (
        "GET",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs",
        {"labelSelector": "rlvr.dev/train-step=" + jobspec.step_key(cfg, SEGMENT_ARGS)},
    )
    ((path, query, body),) = kube.calls("POST")
    assert path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"
    assert query == {"fieldManager": "rlvr", "fieldValidation": "Strict"}
    expected = jobspec.train_job(
        cfg,
        SEGMENT_ARGS,
        name=name,
        namespace="team-a",
        iterations=4,
        owner={
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "task-pod-7",
            "uid": "uid-of-task-pod-7",
            "blockOwnerDeletion": False,
            "controller": False,
        },
    )
    assert {**body, "metadata": {k: v for k, v in body["metadata"].items() if k != "uid"}} == (
        json.loads(json.dumps(expected))
    )
    assert len(kube.calls("GET")) >= 3
    pod_lists = [q for p, q, _ in kube.calls("GET") if p.endswith("/pods")]
    assert pod_lists[0] == {"labelSelector": f"jobset.sigs.k8s.io/jobset-name={name}"}
    logs = [(p, q) for p, q, _ in kube.calls("GET") if p.endswith("/log")]
    firsts = {}
    for p, q in logs:
        firsts.setdefault(p.split("/")[-2], q)
    assert sorted(firsts) == ["j-node-0-0", "j-node-0-1"]
    assert not any("sinceSeconds" in q for q in firsts.values())  # each from its start
    # (the client sends "True"; the API server parses it with Go's strconv.ParseBool)
    assert all((q["container"], q["follow"].lower()) == ("node", "true") for _, q in logs), logs
    ((deleted, _, options),) = kube.calls("DELETE")
    assert deleted.endswith(f"/namespaces/team-a/trainjobs/{name}")
    assert options["preconditions"] == {"uid": "uid-1"}  # this job, never a namesake
    assert options["propagationPolicy"] == "Background"
    text = out.getvalue()
    for line in (
        "[j-node-0-0] rank 0 up",
        "[j-node-0-0] train 00004: loss 0.5",
        "[j-node-0-1] rank 1 up",
        f"submitted TrainJob team-a/{name}: 2 nodes x 8",
        "completed: JobSetCompleted: jobset completed successfully",
    ):
        assert text.count(line) == 1, line


def test_the_job_is_owned_by_the_task_pod_kfp_names_in_its_own_namespace_only(
    tmp_path, in_pod, monkeypatch
):
    """KFP's launcher names the pod (its hostname may be cut to 63 characters), and an owner
    in another namespace would make the garbage collector delete the job at once."""
    cfg = cluster_cfg(tmp_path)
    cfg.cluster.train_job.namespace = "team-a"
    monkeypatch.setenv("KFP_POD_NAME", "a-long-kfp-pod-name-" + "x" * 60)
    monkeypatch.setenv("KFP_POD_UID", "0b7e-uid")
    owners = []
    for ns in ("team-a", "kubeflow", None):  # the task's pod in the job's namespace, or not,
        if ns is None:  # or its namespace unknown (no service account token mounted)
            in_pod.unlink()
        else:
            in_pod.write_text(ns)
        kube = FakeKube([COMPLETE], [], {})
        _commits_as_it_runs(kube, cfg, range(4, 8))
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO())
        ((_, _, body),) = kube.calls("POST")
        owners.append(body["metadata"].get("ownerReferences"))
        assert not [p for p, _, _ in kube.calls("GET") if "/pods/" in p]  # no pod read
        shutil.rmtree(tmp_path / "runs")  # the next try has its checkpoints to commit again
    assert owners == [
        [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "a-long-kfp-pod-name-" + "x" * 60,
                "uid": "0b7e-uid",
                "blockOwnerDeletion": False,
                "controller": False,
            }
        ],
        None,
        None,
    ]


def test_a_dropped_log_stream_is_taken_up_where_it_stopped(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    lines = [f"step {i}" for i in range(4)]
    kube = FakeKube(
        [RUNNING] * 40 + [COMPLETE], [_pod("j-node-0-0", "Running")], {"j-node-0-0": lines}
    )
    _commits_as_it_runs(kube, cfg, range(4, 8))
    kube.log_cut["j-node-0-0"] = 2  # the first two streams drop after a line each
    # (the fake resumes at the exact line; the real API resumes by seconds, so a line may repeat)
    out = io.StringIO()
    jobs.run_job(
        cfg, SEGMENT_ARGS, api_client=kube.client(), out=out, sleep=lambda _: time.sleep(0.05)
    )
    got = [x for x in out.getvalue().splitlines() if x.startswith("[j-node-0-0]")]
    assert got == [f"[j-node-0-0] {x}" for x in lines]


def test_a_failed_job_raises_its_own_message_and_is_deleted(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    pods = [
        _pod("j-node-0-0", "Running"),
        _pod("j-node-0-1", "Failed", {"exitCode": 137, "reason": "OOMKilled"}),
        {**PENDING, "metadata": {"name": "j-node-0-2"}},
    ]
    kube = FakeKube([RUNNING, FAILED], pods, {"j-node-0-1": ["CUDA out of memory"]})
    out = io.StringIO()
    with pytest.raises(StageError) as err:
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=out)
    msg = str(err.value)
    assert msg.startswith(
        f"TrainJob default/{kube.created()} failed: "
        "JobSetFailed: jobset failed: job node-1 has failed"
    )
    assert "j-node-0-1/node: OOMKilled (exit 137)" in msg
    assert "j-node-0-2: pending (0/3 nodes are available: 3 Insufficient nvidia.com/gpu)" in msg
    assert "[j-node-0-1] CUDA out of memory" in out.getvalue()
    assert len(kube.calls("DELETE")) == 1 and not kube.jobs


def test_leftover_jobs_of_the_step_go_first_pods_and_all(tmp_path, in_pod):
    """A task retried after its pod died finds the job its earlier submission left: that job is
    deleted in the foreground (by its uid) and the new one is created, under a new name, only
    once neither the old job nor its pods remain, so no old rank can still write and the new
    job cannot take the old JobSet's status."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([COMPLETE], [], {})
    _commits_as_it_runs(kube, cfg, range(4, 8))
    step = {jobspec.STEP_LABEL: jobspec.step_key(cfg, SEGMENT_ARGS)}
    kube.existing = {
        "old-1": {"metadata": {"name": "old-1", "uid": "u-old", "labels": step}},
        "other": {
            "metadata": {
                "name": "other",
                "uid": "u-x",
                "labels": {  # another step's
                    jobspec.STEP_LABEL: jobspec.step_key(cfg, ["--segment", "2"])
                },
            }
        },
    }
    kube.leftover_pods, kube.pod_lag = [_pod("old-1-node-0-0", "Running")], 2
    sleeps = []
    out = io.StringIO()
    jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=out, sleep=sleeps.append)
    deletes = kube.calls("DELETE")
    assert deletes[0][0].endswith("/trainjobs/old-1")
    assert deletes[0][2]["preconditions"] == {"uid": "u-old"}
    assert deletes[0][2]["propagationPolicy"] == "Foreground"
    assert "other" in kube.existing  # another step's job is left alone
    post = next(i for i, r in enumerate(kube.requests) if r[0] == "POST")
    step_pod_lists = [
        r
        for r in kube.requests[:post]
        if r[1].endswith("/pods") and "train-step" in r[2]["labelSelector"]
    ]
    assert len(step_pod_lists) == 3  # waited while the old pods lingered
    assert kube.created() != "old-1" and deletes[-1][0].endswith(f"/trainjobs/{kube.created()}")
    assert "TrainJob old-1 of this step exists" in out.getvalue()


def test_a_cancel_before_the_job_exists_leaks_nothing(tmp_path, in_pod):
    """SIGTERM is armed before the job is created: a cancel during the leftovers' wait ends
    the task without creating anything."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING], [], {})
    step = {jobspec.STEP_LABEL: jobspec.step_key(cfg, SEGMENT_ARGS)}
    kube.existing = {"old": {"metadata": {"name": "old", "uid": "u", "labels": step}}}
    kube.leftover_pods, kube.pod_lag = [_pod("old-node-0-0", "Running")], 100

    with pytest.raises(SystemExit):
        jobs.run_job(
            cfg,
            SEGMENT_ARGS,
            api_client=kube.client(),
            out=io.StringIO(),
            sleep=lambda _: os.kill(os.getpid(), signal.SIGTERM),
        )
    assert not kube.calls("POST")


def test_a_job_that_completes_without_committing_fails(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    _commit_checkpoints(cfg, range(4, 7))  # the last checkpoint of the segment is missing
    kube = FakeKube([COMPLETE], [], {})
    with pytest.raises(StageError, match=r"completed but .*checkpoints/00008 is not committed"):
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO())
    assert len(kube.calls("DELETE")) == 1


def test_pytorchjob_path_one_iteration(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path, api="training-operator")
    done = {
        "conditions": [
            {"type": "Running", "status": "False"},
            {
                "type": "Succeeded",
                "status": "True",
                "reason": "PyTorchJobSucceeded",
                "message": "PyTorchJob is successfully completed.",
            },
        ]
    }
    pods = [_pod("j-master-0", "Succeeded"), _pod("j-worker-0", "Succeeded")]
    kube = FakeKube([RUNNING, done], pods, {"j-master-0": ["ok"]})
    _commits_as_it_runs(kube, cfg, [5])
    result = jobs.run_job(cfg, ["--iteration", "5"], api_client=kube.client(), out=io.StringIO())
    name = kube.created()
    assert result["uri"].endswith("checkpoints/00006")
    assert result["stats"] == {"train/loss": 5.5} and result["job"] == name
    ((path, _, body),) = kube.calls("POST")
    assert path == "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs"
    assert body["spec"]["runPolicy"]["activeDeadlineSeconds"] == 12 * 3600
    pod_lists = [q for p, q, _ in kube.calls("GET") if p.endswith("/pods")]
    assert pod_lists[0] == {"labelSelector": f"training.kubeflow.org/job-name={name}"}
    logs = [q for p, q, _ in kube.calls("GET") if p.endswith("/log")]
    assert logs and all(q["container"] == "pytorch" for q in logs)
    assert kube.calls("DELETE")[0][0].endswith(f"/pytorchjobs/{name}")


def test_sigterm_deletes_the_job(tmp_path, in_pod):
    """A cancelled pipeline run stops the task with SIGTERM: the wait ends and the job (and so
    its GPU pods) is deleted rather than left running."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING], [], {})

    def sleep(_):
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO(), sleep=sleep)
    assert stop.value.code == 143
    assert len(kube.calls("DELETE")) == 1 and not kube.jobs
    assert signal.getsignal(signal.SIGTERM) == before


def test_job_state_reads_only_true_terminal_conditions():
    kind = jobstatus.KINDS["trainer"]
    assert jobstatus.job_state(kind, {}) == ("running", "")
    assert jobstatus.job_state(
        kind, {"status": {"conditions": [{"type": "Failed", "status": "False"}]}}
    ) == ("running", "")
    assert jobstatus.job_state(kind, {"status": FAILED})[0] == "failed"
    assert (
        jobstatus.job_state(jobstatus.KINDS["training-operator"], {"status": COMPLETE})[0]
        == "running"
    )


def test_an_api_server_that_fails_for_a_while_is_ridden_out(tmp_path, in_pod):
    """A restarting or throttling API server (503, 429, 500) costs a few polls, not the step."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING, 503, 429, 500, RUNNING, COMPLETE], [], {})
    _commits_as_it_runs(kube, cfg, range(4, 8))
    out = io.StringIO()
    result = jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=out)
    assert result["steps"] == 4 and len(kube.calls("DELETE")) == 1
    assert (
        out.getvalue().count("failed (answer 5") == 2
        and "(answer 429); trying again" in out.getvalue()
    )


def test_an_api_server_that_stays_down_fails_the_step_after_the_grace(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING, 503], [], {})
    with pytest.raises(
        StageError,
        match=r"did not answer for 300 s while reading TrainJob "
        r"default/rlvr-train-.*: answer 503",
    ):
        _run_on_a_fake_clock(cfg, kube)
    assert len(kube.calls("DELETE")) == 1


def test_a_job_deleted_by_someone_else_fails_the_step_clearly(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING, 404], [], {})
    with pytest.raises(StageError, match="was deleted while it ran"):
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO())


def test_a_forbidden_answer_is_not_retried(tmp_path, in_pod):
    """403 (the RBAC of manifests/overlays/multi-node not applied) fails at once, named."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([403], [], {})
    with pytest.raises(StageError, match=r"reading TrainJob .* failed: answer 403"):
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO())
    assert len(kube.calls("DELETE")) == 1


def test_pods_that_cannot_start_are_reported_while_waiting(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    pending = PENDING
    kube = FakeKube(
        [RUNNING, RUNNING, RUNNING, COMPLETE], [_pod("j-node-0-0", "Running"), pending], {}
    )
    _commits_as_it_runs(kube, cfg, range(4, 8))
    out = io.StringIO()
    jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=out)
    lines = [x for x in out.getvalue().splitlines() if x.startswith("not running: ")]
    assert lines == [
        "not running: j-node-0-1: pending (0/3 nodes are available: 3 Insufficient nvidia.com/gpu)"
    ]  # said once, not at every poll


def test_a_failed_job_tells_the_other_workers(tmp_path, in_pod):
    """The job's failure becomes the train task's failure marker of the attempt: generate,
    verify and evaluate stop waiting at once, or, when KFP retries the task, for its grace."""
    from components.core.warm import RunStatus, retry_grace_s

    cfg = cluster_cfg(tmp_path)
    for retried in (False, True):
        kube = FakeKube([FAILED], [], {})
        with pytest.raises(StageError):
            jobs.run_job(
                cfg,
                SEGMENT_ARGS,
                attempt="run-abc",
                retried=retried,
                api_client=kube.client(),
                out=io.StringIO(),
            )
        marker = RunStatus.of(cfg, "run-abc").failures()["train"]
        assert "failed: JobSetFailed: jobset failed: job node-1 has failed" in marker["error"]
        assert marker["retry_grace_s"] == (retry_grace_s(cfg, "train") if retried else 0.0)
        RunStatus.of(cfg, "run-abc").clear("train")
    assert retry_grace_s(cfg, "train") > 0  # the retried case above differs from the other


def test_a_ranks_own_failure_marker_is_kept(tmp_path, in_pod):
    """A rank that failed recorded why (a peer stage failed, say): the job's coarser failure
    does not overwrite it."""
    from components.core.warm import RunStatus

    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING, FAILED], [], {})
    kube.on_poll = lambda: RunStatus.of(cfg, "run-abc").mark_failed(  # a rank, during the job
        "train", "PeerFailed: verify failed"
    )
    with pytest.raises(StageError):
        jobs.run_job(
            cfg, SEGMENT_ARGS, attempt="run-abc", api_client=kube.client(), out=io.StringIO()
        )
    assert RunStatus.of(cfg, "run-abc").failures()["train"]["error"] == "PeerFailed: verify failed"


def test_the_train_task_passes_retried_and_attempt_to_the_job(tmp_path, monkeypatch):
    """On a cluster the worker's serve() submits the job with the ranks' own --retried flag,
    so their failure markers carry KFP's retry grace as a one-node train pod's do."""
    from components.train import launch

    seen = {}
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(jobs, "run_job", lambda cfg, args, **kw: seen.update(args=args, **kw))
    launch.serve(cluster_cfg(tmp_path), 1, attempt="run-abc", retried=True)
    assert seen == {
        "args": ["--segment", "1", "--attempt", "run-abc", "--retried"],
        "attempt": "run-abc",
        "retried": True,
    }


def test_pods_that_never_schedule_fail_the_step_after_the_schedule_timeout(tmp_path, in_pod):
    cfg = cluster_cfg(tmp_path)
    cfg.cluster.train_job.schedule_timeout_s = 600
    pending = PENDING
    kube = FakeKube([RUNNING], [_pod("j-node-0-0", "Running"), pending], {})
    with pytest.raises(
        StageError,
        match=r"pods still Pending after 600 s \(cluster.train_job."
        r"schedule_timeout_s\)\n  j-node-0-1: pending \(0/3 nodes",
    ):
        _run_on_a_fake_clock(cfg, kube)
    assert len(kube.calls("DELETE")) == 1


def test_a_job_that_never_gets_a_pod_fails_after_the_schedule_timeout(tmp_path, in_pod):
    """No controller running (or the runtime missing): the job stays podless forever."""
    cfg = cluster_cfg(tmp_path)
    cfg.cluster.train_job.schedule_timeout_s = 600
    kube = FakeKube([RUNNING], [], {})
    with pytest.raises(
        StageError,
        match=r"pods still Pending after 600 s .*\n  no pod was created: "
        r"check that Kubeflow Trainer's controller \(and JobSet's\) is running and "
        r"the ClusterTrainingRuntime 'rlvr-train' exists",
    ):
        _run_on_a_fake_clock(cfg, kube)
    assert len(kube.calls("DELETE")) == 1
    assert kube.gets[next(iter(kube.gets))] == 8  # t = 0..700 s: failed at the first poll past 600


def test_a_suspended_job_waits_for_its_queue_without_the_schedule_timeout(tmp_path, in_pod):
    """Kueue holds a job suspended (no pods) until its quota admits it; then it runs."""
    cfg = cluster_cfg(tmp_path)
    cfg.cluster.train_job.schedule_timeout_s = 600
    held = {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended"}]}
    kube = FakeKube([held] * 20 + [RUNNING, COMPLETE], [], {})
    _commits_as_it_runs(kube, cfg, range(4, 8))
    result = _run_on_a_fake_clock(cfg, kube)
    assert result["steps"] == 4 and len(kube.calls("DELETE")) == 1
    assert kube.gets[result["job"]] == 22  # 2,000 s suspended, past the 600 s timeout
    assert jobstatus.suspended({"spec": {"runPolicy": {"suspend": True}}})  # a PyTorchJob's
    assert jobstatus.suspended({"spec": {"suspend": True}})  # a TrainJob's, before the condition
    assert not jobstatus.suspended({"spec": {"suspend": False}, "status": RUNNING})


def test_an_old_trainer_gets_a_hint(tmp_path, in_pod):
    """Trainer v2.0 / v2.1 do not know runtimePatches: Strict validation refuses the job."""
    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING], [], {})
    kube.create_error = (
        400,
        {
            "kind": "Status",
            "code": 400,
            "message": "TrainJob in version "
            '"v1alpha1" cannot be handled as a TrainJob: strict decoding '
            'error: unknown field "spec.runtimePatches"',
        },
    )
    with pytest.raises(
        StageError,
        match=r"(?s)creating TrainJob .* failed: .*unknown field.*"
        r"need Kubeflow Trainer v2.2 or later",
    ):
        jobs.run_job(cfg, SEGMENT_ARGS, api_client=kube.client(), out=io.StringIO())
    assert not kube.calls("DELETE")[0][2].get("preconditions")  # nothing was created: no uid


def test_a_cluster_without_the_crd_says_what_to_install(tmp_path, in_pod):
    """The commonest first mistake: Kubeflow Trainer not installed. The first call (the search
    for leftovers) says so, the marker tells the peers, and nothing is created."""
    from components.core.warm import RunStatus

    cfg = cluster_cfg(tmp_path)
    kube = FakeKube([RUNNING], [], {})
    kube.no_crd = True
    with pytest.raises(
        StageError,
        match=r"listing the trainjobs of this step: the cluster has no "
        r"trainjobs.trainer.kubeflow.org \(install Kubeflow Trainer v2.2 or later",
    ):
        jobs.run_job(
            cfg, SEGMENT_ARGS, attempt="run-abc", api_client=kube.client(), out=io.StringIO()
        )
    assert not kube.calls("POST") and not kube.calls("DELETE")
    assert (
        "the cluster has no trainjobs" in RunStatus.of(cfg, "run-abc").failures()["train"]["error"]
    )


def test_an_earlier_tries_marker_is_cleared_then_replaced(tmp_path, in_pod):
    """KFP retries the task under the same attempt id: the marker its first try left must not
    stand for this try (peers would count their grace from the first failure)."""
    from components.core.warm import RunStatus

    cfg = cluster_cfg(tmp_path)
    RunStatus.of(cfg, "run-abc").mark_failed("train", "old try: OOM")
    kube = FakeKube([FAILED], [], {})
    with pytest.raises(StageError):
        jobs.run_job(
            cfg,
            SEGMENT_ARGS,
            attempt="run-abc",
            retried=True,
            api_client=kube.client(),
            out=io.StringIO(),
        )
    assert "job node-1 has failed" in RunStatus.of(cfg, "run-abc").failures()["train"]["error"]
    _commit_checkpoints(cfg, range(4, 8))  # and a try that succeeds leaves no marker
    RunStatus.of(cfg, "run-abc").mark_failed("train", "old try: OOM")
    jobs.run_job(
        cfg,
        SEGMENT_ARGS,
        attempt="run-abc",
        api_client=FakeKube([COMPLETE], [], {}).client(),
        out=io.StringIO(),
    )
    assert "train" not in RunStatus.of(cfg, "run-abc").failures()


def test_a_node_that_cannot_start_fails_the_step_after_five_minutes(tmp_path, in_pod):
    """A missing Secret or a bad image name does not cure itself: the step fails with it long
    before the scheduling timeout (an hour)."""
    cfg = cluster_cfg(tmp_path)
    broken = {
        "metadata": {"name": "j-node-0-1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "node",
                    "state": {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": 'secret "rlvr-object-store" not found',
                        }
                    },
                }
            ],
        },
    }
    kube = FakeKube([RUNNING], [_pod("j-node-0-0", "Running"), broken], {})
    with pytest.raises(
        StageError,
        match=r"a node cannot start, and waiting will not help .*\n  "
        r"j-node-0-1/node: waiting \(CreateContainerConfigError: secret "
        r'"rlvr-object-store" not found\)',
    ):
        _run_on_a_fake_clock(cfg, kube)
    assert 4 <= len([p for p, _, _ in kube.calls("GET") if "/trainjobs/" in p]) <= 5  # ~300 s


def test_every_pending_pod_is_named_even_while_its_image_pulls():
    pulling = {
        "metadata": {"name": "j-node-0-1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "node", "state": {"waiting": {"reason": "ContainerCreating"}}}
            ],
        },
    }
    assert jobstatus.pod_failures([pulling]) == ["j-node-0-1: pending (ContainerCreating)"]
    assert jobstatus.pod_failures([_pod("j-node-0-0", "Running")]) == []
    assert jobstatus.fatal_waits([pulling]) == []
