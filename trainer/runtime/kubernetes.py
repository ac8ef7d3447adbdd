"""TF_CONFIG for a worker of a Kubernetes indexed Job behind a headless Service
(examples/kubernetes.yaml): worker i is the pod `<job>-<i>`, reachable as
`<job>-<i>.<service>:<port>`, and knows i from JOB_COMPLETION_INDEX.

    export TF_CONFIG="$(python -m trainer.runtime.kubernetes)"
"""

import json
import os


def tf_config(index, workers, job, service, port):
    """The TF_CONFIG (a JSON string) of worker `index` of `workers`."""
    if not 0 <= index < workers:
        raise ValueError(f"worker index {index} is outside the {workers} workers.")
    return json.dumps({"cluster": {"worker": [f"{job}-{i}.{service}:{port}"
                                              for i in range(workers)]},
                       "task": {"type": "worker", "index": index}})


def from_environment(env=os.environ):
    """tf_config from the pod's environment: JOB_COMPLETION_INDEX (set by Kubernetes),
    TFTRAINER_WORKERS, TFTRAINER_JOB, TFTRAINER_SERVICE, TFTRAINER_PORT (the manifest's)."""
    missing = [k for k in ("JOB_COMPLETION_INDEX", "TFTRAINER_WORKERS", "TFTRAINER_JOB",
                           "TFTRAINER_SERVICE") if k not in env]
    if missing:
        raise SystemExit(f"Not set: {', '.join(missing)} (see examples/kubernetes.yaml).")
    return tf_config(int(env["JOB_COMPLETION_INDEX"]), int(env["TFTRAINER_WORKERS"]),
                     env["TFTRAINER_JOB"], env["TFTRAINER_SERVICE"],
                     int(env.get("TFTRAINER_PORT", "2222")))


if __name__ == "__main__":
    print(from_environment())
