"""Strict offline validation of Kubeflow objects against the released API models.

Kubeflow Trainer's TrainJob and ClusterTrainingRuntime go through `kubeflow-trainer-api`'s
models (pydantic, generated from the Trainer's CRD OpenAPI schemas); the Training Operator's
PyTorchJob through `kubeflow-training`'s (swagger models, whose pod templates are the
`kubernetes` client's). A model rejects a wrong type outright but drops a field it does not know,
so an object is valid only when it survives the round trip unchanged: a misspelt or misplaced
field shows up as the first path that differs.
"""

from __future__ import annotations

import json
from typing import Any

import pytest


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in b:
                return f"{path}.{k} (not in the schema)"
            if k not in a:
                return f"{path}.{k} (added by the schema)"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} (length {len(a)} != {len(b)})"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path} ({a!r} != {b!r})"


def _trainer_model(kind: str):
    models = pytest.importorskip(
        "kubeflow_trainer_api.models",
        reason="kubeflow-trainer-api (the dev extra) validates Trainer objects",
    )
    return {
        "TrainJob": models.TrainerV1alpha1TrainJob,
        "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
        "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime,
    }[kind]


def assert_valid(obj: dict[str, Any]) -> None:
    """`obj` (a TrainJob, ClusterTrainingRuntime or PyTorchJob) is valid, strictly."""
    obj = json.loads(json.dumps(obj))  # plain JSON, as it goes over the wire
    kind = obj.get("kind")
    if kind == "PyTorchJob":
        pytest.importorskip("kubeflow.training", reason="kubeflow-training validates PyTorchJobs")
        from kubeflow.training.api_client import ApiClient

        class Response:
            data = json.dumps(obj)

        client = ApiClient()
        back = client.sanitize_for_serialization(
            client.deserialize(Response(), "KubeflowOrgV1PyTorchJob")
        )
    else:
        back = _trainer_model(kind).from_dict(obj).to_dict()
        back = json.loads(json.dumps(back, default=str))
    diff = first_difference(obj, back)
    assert diff is None, f"{kind} {obj['metadata'].get('name')}: {diff}"
