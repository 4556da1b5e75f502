"""`rlvr run --runner docker`, the parts that need no Docker engine: what each task's container
gets (mounts, user, network, the code-sandbox profile, KFP's command as the entry point), the
run directory handed to the images' uid, inputs checked readable by it, and the log and exit
status of a container. The engine itself is exercised by images/smoke.py and
tests/images/test_built_images.py."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import pytest

from components.core.config import load_config
from pipelines import local_docker
from pipelines.local_docker import DockerPlan, DockerSetupError, Mount, plan_for, stage_of
from tests.support.runs import write_config


def test_tasks_map_to_their_stage_images():
    assert stage_of("generate") == "generate"
    assert stage_of("verify-shard-00001-of-00002") == "verify"
    assert stage_of("evaluate-gather") == "evaluate"
    assert stage_of("next-segment") == stage_of("report") == stage_of("init") == "init"


def test_the_plan_mounts_the_run_and_its_inputs(tmp_path, tiny_assets):
    plugin = tmp_path / "plugins" / "my_reward.py"
    plugin.parent.mkdir()
    plugin.write_text("def score(**kw):\n    return 1.0\n")
    cfg = load_config(
        write_config(tmp_path, tiny_assets),
        [
            f"verify.rewards.custom={plugin}:score",
            "cluster.image_repo=rlvr.local",
            "cluster.image_tag=t1",
        ],
    )
    run_root = Path(cfg.run.store) / cfg.run_id
    plan = plan_for(cfg, run_root)
    mounts = {m.target: m.read_only for m in plan.mounts}
    assert mounts[str(run_root)] is False  # the run: read-write
    for path in (cfg.model.base, cfg.data.train, *(e.path for e in cfg.data.eval)):
        covered = [h for h in mounts if path == h or path.startswith(h + "/")]
        assert covered and all(mounts[h] for h in covered), path  # inputs: read-only
    assert mounts[str(plugin)] is True  # the plugin file alone, not its directory
    assert plan.user is None and plan.network == "none"
    assert plan.images["verify"] == "rlvr.local/rlvr-verify:t1"
    assert plan.images["init"] == "rlvr.local/rlvr-train:t1"  # init runs on the train image
    profile = json.loads(plan.seccomp_profile)
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and profile["syscalls"]
    # a remote store or input needs the network; the caller's uid on request
    cfg.run.store = "s3://bucket/runs"
    host = plan_for(cfg, run_root, user="host")
    assert host.network == "host" and host.user == f"{os.getuid()}:{os.getgid()}"
    assert plan_for(cfg, run_root, user="1234:5").user == "1234:5"


def test_module_plugins_are_mounted_and_importable(tmp_path, monkeypatch, tiny_assets):
    pkg = tmp_path / "src" / "acme_rewards"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "score.py").write_text("def f(**kw):\n    return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    cfg = load_config(
        write_config(tmp_path, tiny_assets), ["verify.rewards.custom=acme_rewards.score:f"]
    )
    (mount,) = local_docker.plugin_mounts(cfg)
    # the package alone, under the plugin root: never the directory around it (a site-packages
    # whose torch would shadow the image's, a project root with its runs)
    assert mount == Mount(str(pkg.resolve()), "/opt/rlvr-plugins/acme_rewards", True)
    plan = plan_for(cfg, tmp_path / "runs" / "t")
    assert plan.pythonpath == ["/opt/rlvr-plugins"]


def _m(path: str, read_only: bool) -> Mount:
    return Mount(path, path, read_only)


def test_nested_mounts_collapse_to_the_outermost():
    got = local_docker._outermost(
        [
            _m("/a/run", False),
            _m("/a/run/data", True),
            _m("/a/runs2", True),
            _m("/b", True),
            _m("/b", False),
            _m("/p", True),
            _m("/p/data", True),
            _m("/p/rlvr-runs/r", False),
        ]
    )
    # a read-write run inside a read-only input directory stays: Docker stacks nested binds
    assert got == [
        _m("/b", False),
        _m("/p", True),
        _m("/a/run", False),
        _m("/a/runs2", True),
        _m("/p/rlvr-runs/r", False),
    ]


def test_symlinked_inputs_mount_at_the_configs_path(tmp_path, tiny_assets):
    """A path with a symlink in it is mounted from its real location at the path the config
    gives, and files a snapshot links to outside it (a Hugging Face cache's blobs) come along."""
    cache = tmp_path / "hub"
    (cache / "blobs").mkdir(parents=True)
    (cache / "snapshots" / "abc").mkdir(parents=True)
    (cache / "blobs" / "f00d").write_text("{}")
    (cache / "snapshots" / "abc" / "config.json").symlink_to("../../blobs/f00d")
    (tmp_path / "model").symlink_to(cache / "snapshots" / "abc")
    cfg = load_config(write_config(tmp_path, tiny_assets), [f"model.base={tmp_path}/model"])
    plan = plan_for(cfg, tmp_path / "runs" / "t")
    got = {m.target: m.source for m in plan.mounts}
    assert got[f"{tmp_path}/model"] == str((cache / "snapshots" / "abc").resolve())
    # where ../../blobs/f00d resolves from <tmp>/model/config.json inside the container
    assert got[str(tmp_path.parent / "blobs" / "f00d")] == str((cache / "blobs" / "f00d").resolve())


def test_unreadable_inputs_are_refused_with_the_fix(tmp_path):
    ckpt = tmp_path / "base"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"x")
    (ckpt / "model.safetensors").chmod(0o600)  # what transformers 5 writes
    owner = os.stat(ckpt).st_uid
    other = owner + 10001
    with pytest.raises(DockerSetupError, match=r"cannot read .*model\.safetensors.*chmod -R a\+rX"):
        local_docker._check_readable(ckpt, other, other)
    (ckpt / "model.safetensors").chmod(0o644)
    local_docker._check_readable(ckpt, other, other)
    ckpt.chmod(0o700)  # mkdtemp's mode: not even listable
    with pytest.raises(DockerSetupError, match="mode 0o700"):
        local_docker._check_readable(ckpt, other, other)
    ckpt.chmod(0o755)
    local_docker._check_readable(ckpt, owner, owner)  # the owner reads its own files


@pytest.mark.skipif(os.geteuid() != 0, reason="handing the run over needs root")
def test_root_hands_the_run_directory_to_the_images_uid(tmp_path):
    run = tmp_path / "run"
    (run / "kfp").mkdir(parents=True)
    (run / "run.yaml").write_text("x")
    local_docker.hand_over(run, (10001, 10001))
    for p in (run, run / "kfp", run / "run.yaml"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (10001, 10001), p


def test_a_non_root_caller_is_told_to_run_as_itself(tmp_path, monkeypatch):
    """Only root can hand the run to the images' uid: the directories the caller makes during
    the run (pipeline root, failure markers) would stay its own and unwritable to the tasks."""
    monkeypatch.setattr(local_docker.os, "geteuid", lambda: 1000)
    with pytest.raises(DockerSetupError, match="--docker-user host"):
        local_docker.hand_over(tmp_path / "run", (10001, 10001))


def test_permission_bits_decide_access():
    def st(mode, uid=1, gid=1):
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    assert local_docker._can(st(0o600), 1, 9, 0o4)  # owner
    assert not local_docker._can(st(0o600), 2, 9, 0o4)
    assert local_docker._can(st(0o640), 2, 1, 0o4)  # group
    assert local_docker._can(st(0o604), 2, 9, 0o4)  # other
    assert not local_docker._can(st(0o644), 2, 9, 0o5)  # no x for a directory
    assert local_docker._can(st(0o000), 0, 0, 0o7)  # root


class _Container:
    def __init__(self, lines: list[bytes], status: int) -> None:
        self.lines, self.status, self.removed, self.started = lines, status, False, False

    def start(self):
        self.started = True

    def logs(self, stream: bool, follow: bool):
        yield from self.lines

    def wait(self):
        return {"StatusCode": self.status}

    def remove(self, force: bool = False):
        self.removed = True


class _Client:
    """Records containers.run's arguments, as docker-py's DockerClient takes them."""

    def __init__(self, container: _Container) -> None:
        self.container, self.calls = container, []
        self.containers = self

    def create(self, **kwargs):
        self.calls.append(kwargs)
        return self.container


@pytest.mark.parametrize(
    ("task", "profiled"), [("verify", True), ("evaluate-gather", True), ("train", False)]
)
def test_a_task_container_gets_the_plan(task, profiled, monkeypatch):
    plan = DockerPlan(
        images={},
        mounts=[Mount("/real/runs/r", "/runs/r", False), _m("/data", True)],
        user=None,
        network="none",
        pythonpath=["/plugins"],
        seccomp_profile='{"x": 1}',
        apparmor_unconfined=True,
    )
    written: list[str] = []

    @contextlib.contextmanager
    def open_log(name):
        assert name == task
        yield written.append

    container = _Container([b"one\ntw", b"o\nthree"], status=3)
    client = _Client(container)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("SECRET_OF_THE_HOST", "s")
    for key in local_docker.FORWARDED_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    runner = local_docker.make_container_runner(
        plan, open_log, lambda: task, lambda name: {"OMP_NUM_THREADS": "2"}
    )
    command = ["sh", "-c", "python3 -m kfp.dsl.executor_main"]
    status = runner(
        client,
        "img:1",
        command,
        {"/runs/r/kfp": {"bind": "/runs/r/kfp", "mode": "rw"}},
        environment={"KFP": "1"},
    )
    assert status == 3 and container.started and container.removed
    assert written == ["one\n", "two\n", "three\n"]  # chunks re-split into lines
    (call,) = client.calls
    # KFP's command replaces the image's ENTRYPOINT (`python -m components.<stage>`)
    assert call["entrypoint"] == command and call["command"] == []
    assert call["environment"] == {
        "AWS_ACCESS_KEY_ID": "k",
        "OMP_NUM_THREADS": "2",
        "KFP": "1",
        "PYTHONPATH": "/plugins",
    }
    assert call["volumes"] == [
        "/runs/r/kfp:/runs/r/kfp:rw",
        "/real/runs/r:/runs/r:rw",
        "/data:/data:ro",
    ]
    assert call["network_mode"] == "none" and call["cap_drop"] == ["ALL"] and call["init"]
    assert "user" not in call  # the image's own USER
    assert ("security_opt" in call) is profiled
    if profiled:
        assert call["security_opt"] == ['seccomp={"x": 1}', "apparmor=unconfined"]


def test_another_uid_gets_a_writable_home_and_a_stopped_run_starts_nothing():
    plan = DockerPlan(images={}, mounts=[], user="1000:1000", network="none")
    container = _Container([], status=0)
    client = _Client(container)
    runner = local_docker.make_container_runner(
        plan, lambda t: contextlib.nullcontext(print), lambda: "train", lambda t: {}
    )
    assert runner(client, "img:1", ["true"], {}) == 0
    assert client.calls[0]["user"] == "1000:1000"
    assert client.calls[0]["environment"]["HOME"] == "/tmp"
    local_docker._stopping.set()
    try:
        again = _Container([], status=0)
        assert runner(_Client(again), "img:1", ["true"], {}) == 1
        assert not again.started and again.removed
    finally:
        local_docker._stopping.clear()


def test_rlvr_run_docker_without_an_engine_says_so(tmp_path, tiny_assets, monkeypatch):
    from click.testing import CliRunner

    from pipelines.cli import main

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    config = str(write_config(tmp_path, tiny_assets))
    out = CliRunner().invoke(main, ["run", config, "--runner", "docker", "--skip-check"])
    assert out.exit_code == 2, out.output
    assert "no Docker engine answers" in out.output and "DOCKER_HOST" in out.output
    bad = CliRunner().invoke(main, ["run", config, "--runner", "docker", "--docker-user", "me"])
    assert bad.exit_code == 2 and "use auto, image, host or UID[:GID]" in bad.output
