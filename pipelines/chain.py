"""Chaining the segments of a training run on a cluster: once a segment's training is
committed, its `next-segment` task submits segment+1 as a new run of the same pipeline, so a run
of any length goes on without a client attached (`rlvr submit` submits segment 0, or any one).

The task runs `python -m pipelines.chain` in a fresh interpreter: the KFP executor runs a
component's body with `_KFP_RUNTIME=true`, under which kfp's client and DSL do not import, and
submitting needs both (the pipeline is compiled again from the config, and posted to the API).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from components.core.config import RunConfig
from pipelines.cluster import Submitted, client, submit
from pipelines.train import build_train_pipeline


def segment_run_name(cfg: RunConfig, segment: int) -> str:
    return f"{cfg.run_id}-train-seg{segment:05d}"


def submit_segment(
    cfg: RunConfig,
    params: dict[str, str],
    *,
    segment: int,
    host: str,
    experiment: str,
    namespace: str | None,
    token: str | None,
) -> Submitted:
    """Submit one segment of a training run (`rlvr submit`, and the last task of each segment
    for the next one). The compiled pipeline is the same for every segment: its size does not
    depend on run.iterations; the segment index is a run-time parameter."""
    arguments = {
        **{k: v for k, v in params.items() if v != ""},
        "segment": segment,
        "chain": True,
        "experiment": experiment,
        "namespace": namespace or "",
    }
    return submit(
        cfg,
        build_train_pipeline(cfg),
        host=host,
        experiment=experiment,
        namespace=namespace,
        token=token,
        arguments=arguments,
        run_name=segment_run_name(cfg, segment),
    )


def chain_next_segment(
    params: dict[str, str],
    *,
    segment: int,
    chain: bool,
    experiment: str,
    namespace: str,
    attempt: str = "local",
) -> str:
    """Body of the `next-segment` task: once the segment's last checkpoint is committed, submit
    segment+1 of the run from inside the cluster (`cluster.kfp_api`, the pod's service account
    token). Returns the new run id, or "" for the last segment, when chaining is off and when
    the run stopped under its health rule. It fails, submitting nothing, when a worker of the
    segment fails."""

    from components.core.config import effective_config
    from components.core.warm import segments

    cfg = effective_config(**params)
    if not chain or segment + 1 >= len(segments(cfg)):
        return ""
    # Started beside the workers: wait, like them, for the segment's training to be committed.
    from components.core.layout import RunLayout, store_for
    from components.core.run_control import StopWatch
    from components.core.warm import RunStatus, RunStopped, wait_committed
    from components.core.warm import segment as segment_of

    layout, stop = RunLayout.of(cfg), segment_of(cfg, segment).stop
    store = store_for(cfg)
    watch = StopWatch(cfg)  # the run stopped under its health rule: no next segment
    try:
        wait_committed(
            store,
            [layout.checkpoint(stop)],
            status=RunStatus.of(cfg, attempt),
            task="next-segment",
            timeout_s=cfg.run.wait_timeout_s * max(1, cfg.run.segment_iterations),
            poll_max_s=cfg.run.poll_max_s or 5.0,
            stopped=lambda: watch.past("evaluate", stop),
        )
    except RunStopped:
        return ""
    if watch(force=True) is not None:
        return ""
    # Exactly once: a retried task (its pod lost after the submission) finds the claim.
    claim = layout.segment_claim(segment + 1)
    if store.exists(claim):
        record = json.loads(store.read_text(claim))
        logging.getLogger("rlvr.chain").info(
            "segment %d was already submitted as run %s", segment + 1, record["run_id"]
        )
        return record["run_id"]
    name = segment_run_name(cfg, segment + 1)
    existing = find_run(cfg.cluster.kfp_api, name, namespace or None)
    run_id = (
        existing
        or submit_segment(
            cfg,
            params,
            segment=segment + 1,
            host=cfg.cluster.kfp_api,
            experiment=experiment,
            namespace=namespace or None,
            token=None,
        ).run_id
    )
    store.write_text(claim, json.dumps({"run_id": run_id, "name": name, "by": attempt}))
    logging.getLogger("rlvr.chain").info("segment %d submitted as run %s", segment + 1, run_id)
    return run_id


def find_run(host: str, name: str, namespace: str | None) -> str | None:
    """The id of a run with this display name that is not over yet (a submission whose claim
    was lost with its pod), or None."""
    c = client(host, namespace, None)
    flt = json.dumps(
        {"predicates": [{"key": "display_name", "operation": "EQUALS", "string_value": name}]}
    )
    try:
        runs = c.list_runs(page_size=10, filter=flt, namespace=namespace).runs or []
    except Exception:  # noqa: BLE001 - a lookup that fails must not stop the chain
        return None
    for r in runs:
        if r.display_name == name and str(r.state) not in ("FAILED", "CANCELED", "SKIPPED"):
            return r.run_id
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.chain PARAMS_JSON --segment S ...`: what the next-segment task runs;
    prints the submitted run's id (empty: nothing to submit)."""
    from components.core.stage_cli import setup_logging

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("params", help="the pipeline's run-time parameters, as JSON")
    ap.add_argument("--segment", type=int, required=True)
    ap.add_argument("--experiment", default="rlvr")
    ap.add_argument("--namespace", default="")
    ap.add_argument("--attempt", default="local")
    args = ap.parse_args(argv)
    setup_logging()
    run_id = chain_next_segment(
        json.loads(args.params),
        segment=args.segment,
        chain=True,
        experiment=args.experiment,
        namespace=args.namespace,
        attempt=args.attempt,
    )
    print(run_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
