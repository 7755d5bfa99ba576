"""The Job controller of a sandbox cluster (``batch/v1``, e.g. the Curvine chart's pre-upgrade hook, which helm
waits for): one pod at a time, up to ``backoffLimit`` retries. A Job pod exits 0 once it has run (the sandbox runs
no container), unless its pod template carries the annotation ``sandbox.kvfleet.io/exit-code`` (a fault hook: that
exit code, so a failing hook can be shown); the Job then reports ``Complete`` or ``Failed``
(``BackoffLimitExceeded``) like the Job controller (kubernetes ``pkg/controller/job``).

Run by ``kvfleet_sandbox.controllers.workloads.WorkloadController`` in every pass.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from kvfleet_sandbox.controllers._objects import stamp, uid_of
from kvfleet_sandbox.controllers.workloads._cache import Snapshot, omit_zero
from kvfleet_sandbox.controllers.workloads._writes import ObjectWriter

JOB_EXIT_CODE_ANNOTATION = "sandbox.kvfleet.io/exit-code"  # fault hook on a Job's pod template (see module doc)


def _finished(status: dict[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _terminal_conditions(types: tuple[str, str], reason: str, message: str, now: str) -> list[dict[str, Any]]:
    return [{"type": t, "status": "True", "reason": reason, "message": message, "lastProbeTime": now,
             "lastTransitionTime": now} for t in types]


class JobController:
    """See the module docstring; one per cluster twin."""

    def __init__(self, writer: ObjectWriter) -> None:
        self.w = writer

    def sync(self, job: dict[str, Any], snap: Snapshot) -> None:
        """One pod at a time (``parallelism``/``completions`` 1, what helm hooks use); a Running pod of a Job has
        done its work by the next pass and exits; ``backoffLimit`` failed pods fail the Job."""
        status = dict(job.get("status") or {})
        if _finished(status):
            return
        spec = job.get("spec") or {}
        pods = snap.owned(uid_of(job))
        for pod in pods:
            if (pod.get("status") or {}).get("phase") == "Running":
                self._exit_pod(pod, job)
        pods = [self.w.store.get("", "pods", p["metadata"]["name"], p["metadata"]["namespace"]) or p for p in pods]
        phases = [(p.get("status") or {}).get("phase", "Pending") for p in pods]
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        active = len(phases) - succeeded - failed
        now = stamp(self.w.clock)
        new = {**status, "startTime": status.get("startTime") or now}
        new.update(active=active, succeeded=succeeded, failed=failed, ready=0)
        if succeeded >= int(spec.get("completions", 1) or 1):
            new.update(completionTime=now, active=0, conditions=_terminal_conditions(
                ("SuccessCriteriaMet", "Complete"), "CompletionsReached", "Reached expected number of succeeded "
                "pods", now))
        elif failed > int(spec.get("backoffLimit", 6)):
            new.update(active=0, conditions=_terminal_conditions(
                ("FailureTarget", "Failed"), "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                now))
        elif active == 0:
            self._start_pod(job, len(pods))
            new["active"] = 1
        self.w.set_status("batch", "jobs", job, omit_zero(new))

    def _start_pod(self, job: dict[str, Any], attempt: int) -> None:
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        name = job["metadata"]["name"]
        labels.update({"batch.kubernetes.io/job-name": name, "job-name": name,
                       "batch.kubernetes.io/controller-uid": uid_of(job), "controller-uid": uid_of(job)})
        suffix = hashlib.sha256(f"{uid_of(job)}/{attempt}".encode()).hexdigest()[:5]
        self.w.create_pod(job, template, f"{name}-{suffix}")

    def _exit_pod(self, pod: dict[str, Any], job: dict[str, Any]) -> None:
        annotations = ((((job.get("spec") or {}).get("template") or {}).get("metadata") or {})
                       .get("annotations") or {})
        try:
            code = int(annotations.get(JOB_EXIT_CODE_ANNOTATION, "0"))
        except ValueError:
            code = 1
        now = stamp(self.w.clock)

        def finish(p: dict[str, Any]) -> dict[str, Any] | None:
            status = p.setdefault("status", {})
            if status.get("phase") != "Running":
                return None
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            for cond in status.get("conditions") or []:
                if cond.get("type") in ("Ready", "ContainersReady"):
                    cond.update(status="False", reason="PodCompleted", lastTransitionTime=now)
            for cs in status.get("containerStatuses") or []:
                cs.update(ready=False, started=False, state={"terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": (cs.get("state") or {}).get("running", {}).get("startedAt", now),
                    "finishedAt": now}})
            return p
        self.w.store.mutate("", "pods", pod["metadata"]["name"], pod["metadata"]["namespace"], finish)
