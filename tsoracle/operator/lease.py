"""One active operator at a time: a coordination.k8s.io Lease, renewed while it is held.

Why a Lease rather than kopf peering: peering pauses operators by priority and needs its own
cluster-wide CRD; a Lease is the Kubernetes primitive for exactly "one holder, taken over when it
stops renewing", needs only get/create/update on one object in the operator's namespace, and is
what kube-controller-manager uses. A holder that stops renewing (paused, partitioned) loses it
after `DURATION_S`; what it was doing when it stopped is made harmless by the storage (a flip or
fencing change asked for by an older resource generation changes nothing), not by the Lease.

Every call has a request timeout: without one, an API server that stops answering on an open
connection (a replica gone behind a load balancer) held the renewal for as long as TCP kept the
connection, about 15 minutes, and a one-replica operator stood by all that time. An attempt
(up to four calls) must end within the window a renewal holds the Lease for, so its answer
can never arrive after the Lease it renews may have passed to another operator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
import uuid

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tsoracle.operator.kube import single_try_client
from tsoracle.operator.logs import describe_api_error, is_transient, starting_up

DURATION_S = 15
OWNER_RETRY_S = 60
RENEW_EVERY_S = 5
MIN_CALL_S = 0.2  # less left in an attempt than this: give up rather than call
log = logging.getLogger("tsoracle.operator.lease")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class AttemptTimedOut(TimeoutError):
    """An acquire or renew attempt used up its window before its last call."""


class LeaderLease:
    def __init__(self, namespace: str, name: str, identity: str | None = None,
                 owner: str | None = None, *, duration_s: float = DURATION_S,
                 renew_every_s: float = RENEW_EVERY_S,
                 api: client.ApiClient | None = None) -> None:
        """`owner`: the operator's Deployment (in `namespace`); the Lease names it as its owner,
        so deleting the Deployment (`helm uninstall`) deletes the Lease too. `api`: a client
        without urllib3 retries (`single_try_client`); by default one from the environment."""
        if renew_every_s <= 0 or duration_s <= renew_every_s:
            raise ValueError("a Lease is renewed more often than it lasts")
        self.namespace, self.name = namespace, name
        self.owner = owner
        self.duration_s, self.renew_every_s = duration_s, renew_every_s
        # How long a renewal holds the Lease, counted from when its attempt started; also how
        # long an attempt may take (see `_timeout`).
        self.window_s = duration_s - renew_every_s
        self._client, self._own_client = api, api is None
        self._owner_ref: client.V1OwnerReference | None = None
        self._owner_tried_at: float = -OWNER_RETRY_S  # monotonic; a failed lookup is retried later
        self._owner_told = False
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._held_until = 0.0  # monotonic; renewals push it forward
        self._changed = asyncio.Event()
        # Expiry is judged by our own clock, from when we last saw the record change (as
        # client-go does), never by comparing another host's renewTime with our wall clock.
        self._seen: tuple[str, object] | None = None
        self._seen_at = 0.0
        self._told_holder = ""  # the other holder we last said we stand by for
        self._holding = False  # as last told: "acquired" until "lost"
        self._told_failure = ""
        self._task: asyncio.Task[None] | None = None

    def held(self) -> bool:
        # A margin below the lease duration: stop acting before another operator may start.
        return time.monotonic() < self._held_until

    async def wait_held(self) -> None:
        while not self.held():
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), self.renew_every_s)
            except TimeoutError:
                pass

    def start(self) -> None:
        """Acquire and renew in the background (`run`) until `stop`."""
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        """Stop renewing; `run` then releases the lease, so a successor starts at once."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        """Acquire and renew until cancelled; then release, so a successor need not wait."""
        try:
            while True:
                started = time.monotonic()
                try:
                    if await asyncio.to_thread(self._try_acquire):
                        self._acquired(started)
                    else:
                        self._not_acquired()
                    self._told_failure = ""
                except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                    # urllib3's MaxRetryError (connection refused) is no OSError: without it
                    # an API server restart ended this task, and the lease was never renewed.
                    self._tell_failure(exc)
                    if _timed_out(exc):
                        self._step_down()
                await asyncio.sleep(self.renew_every_s)
        finally:
            if self.held():
                await self._release_on_exit()
            if self._own_client and self._client is not None:
                self._client.close()
                self._client = None

    def _acquired(self, started: float) -> None:
        was = self.held()
        self._held_until = started + self.window_s
        if not was:
            if not self._holding:
                log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
            self._holding = True
            self._told_holder = ""
            self._changed.set()

    def _not_acquired(self) -> None:
        self._step_down()
        holder = self._seen[0] if self._seen else ""
        if holder and holder != self._told_holder:
            log.info("lease %s/%s held by %s; standing by", self.namespace, self.name, holder)
            self._told_holder = holder

    def _step_down(self) -> None:
        """Act on nothing until an attempt succeeds again. After a timed-out call too: the
        renewal may or may not have reached the API server, and the attempt has used up the
        window its last success held the Lease for."""
        self._held_until = 0.0
        if self._holding:  # also when paused past expiry: held() said no
            log.warning("lease %s/%s lost", self.namespace, self.name)
            self._holding = False

    async def _release_on_exit(self) -> None:
        self._held_until = 0.0
        try:
            await asyncio.to_thread(self._release)
            log.info("lease %s/%s released", self.namespace, self.name)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("lease %s/%s not released (%s); a successor takes over once it "
                        "expires", self.namespace, self.name, describe_api_error(exc))

    def _tell_failure(self, exc: BaseException) -> None:
        """Once per cause: a starting API server's answers at INFO, the rest at WARNING."""
        what = describe_api_error(exc)
        if what == self._told_failure:
            return
        self._told_failure = what
        # `_holding`, not held(): a renewal that timed out has outlasted the window it renews.
        if not self._holding and starting_up() and is_transient(exc):
            log.info("lease %s/%s: API server not ready yet (%s); retrying", self.namespace,
                     self.name, what)
        else:
            log.warning("lease %s/%s not %s (%s); retrying", self.namespace, self.name,
                        "renewed" if self._holding else "acquired", what)

    def _api_client(self) -> client.ApiClient:
        if self._client is None:  # made on first use: it reads the kubeconfig
            self._client = single_try_client()
        return self._client

    def _timeout(self, deadline: float) -> tuple[float, float]:
        """(connect, read) for the next call of an attempt that must end by `deadline`
        (monotonic): what is left of the window, a quarter of the window at most to connect."""
        left = deadline - time.monotonic()
        if left < MIN_CALL_S:
            raise AttemptTimedOut(f"no time left in the {self.window_s:g} s window")
        connect = min(left / 2, self.window_s / 4)
        return connect, left - connect

    def _owner_reference(self, deadline: float) -> client.V1OwnerReference | None:
        """The Deployment to name as owner; a failed lookup (RBAC still loading, the
        Deployment being replaced) is retried every OWNER_RETRY_S, and never blocks the Lease."""
        due = time.monotonic() - self._owner_tried_at >= OWNER_RETRY_S
        if self.owner and self._owner_ref is None and due:
            self._owner_tried_at = time.monotonic()
            try:
                dep = client.AppsV1Api(self._api_client()).read_namespaced_deployment(
                    self.owner, self.namespace, _request_timeout=self._timeout(deadline))
            except ApiException as exc:
                if is_transient(exc):
                    raise
                if not self._owner_told:
                    log.warning("lease %s/%s: cannot read Deployment %s (%s); until it can, "
                                "the Lease does not name it as owner and outlives an uninstall",
                                self.namespace, self.name, self.owner, describe_api_error(exc))
                    self._owner_told = True
            else:
                meta = dep.metadata
                if meta is not None and meta.name and meta.uid:  # the API server sets both
                    self._owner_ref = client.V1OwnerReference(
                        api_version="apps/v1", kind="Deployment", name=meta.name, uid=meta.uid)
        return self._owner_ref

    def _try_acquire(self) -> bool:
        """One attempt; it ends within `window_s` (a call that would not is not made)."""
        deadline = time.monotonic() + self.window_s
        api = client.CoordinationV1Api(self._api_client())
        now = _now()
        owner = self._owner_reference(deadline)
        try:
            lease = api.read_namespaced_lease(self.name, self.namespace,
                                              _request_timeout=self._timeout(deadline))
        except ApiException as exc:
            if exc.status != 404:
                raise
            return self._create(api, now, owner, deadline)
        return self._take_or_renew(api, lease, now, owner, deadline)

    def _create(self, api: client.CoordinationV1Api, now: dt.datetime,
                owner: client.V1OwnerReference | None, deadline: float) -> bool:
        if self.held():
            # Deleted under us (its owner Deployment was deleted or replaced): that is a
            # loss, not a free Lease; a stale owner uid is looked up again.
            self._owner_ref, self._owner_tried_at = None, -OWNER_RETRY_S
            return False
        meta = client.V1ObjectMeta(name=self.name, namespace=self.namespace,
                                   owner_references=[owner] if owner else None)
        body = client.V1Lease(
            metadata=meta,
            spec=client.V1LeaseSpec(holder_identity=self.identity,
                                    lease_duration_seconds=round(self.duration_s),
                                    acquire_time=now,
                                    renew_time=now, lease_transitions=0))
        try:
            api.create_namespaced_lease(self.namespace, body,
                                        _request_timeout=self._timeout(deadline))
        except ApiException as exc:
            if exc.status == 409:
                return False  # someone else created it first
            if exc.status != 403 or owner is None:
                raise
            # Clusters enforcing owner-reference permissions want delete on the Lease to
            # name an owner: a Lease without one still elects.
            meta.owner_references = None
            self._owner_ref, self._owner_tried_at = None, time.monotonic()
            api.create_namespaced_lease(self.namespace, body,
                                        _request_timeout=self._timeout(deadline))
        return True

    def _take_or_renew(self, api: client.CoordinationV1Api, lease: client.V1Lease,
                       now: dt.datetime, owner: client.V1OwnerReference | None,
                       deadline: float) -> bool:
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        record = (holder, spec.renew_time)
        if record != self._seen:
            self._seen, self._seen_at = record, time.monotonic()
        duration = spec.lease_duration_seconds or self.duration_s
        expired = time.monotonic() - self._seen_at > duration
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        lease.metadata = lease.metadata or client.V1ObjectMeta()
        refs = lease.metadata.owner_references or []
        if owner and all(ref.uid != owner.uid for ref in refs):
            # A Lease from before the owner was set, or from a Deployment deleted and made again.
            lease.metadata.owner_references = [
                *(r for r in refs if (r.kind, r.name) != ("Deployment", owner.name)), owner]
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = round(self.duration_s)
        lease.spec = spec
        try:
            # The resourceVersion in `lease` makes this a compare-and-swap: of two operators
            # taking over an expired lease at once, one gets 409 Conflict.
            api.replace_namespaced_lease(self.name, self.namespace, lease,
                                         _request_timeout=self._timeout(deadline))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def _release(self) -> None:
        deadline = time.monotonic() + self.window_s
        api = client.CoordinationV1Api(self._api_client())
        lease = api.read_namespaced_lease(self.name, self.namespace,
                                          _request_timeout=self._timeout(deadline))
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return
        lease.spec.holder_identity = ""
        lease.spec.renew_time = None
        api.replace_namespaced_lease(self.name, self.namespace, lease,
                                     _request_timeout=self._timeout(deadline))


def _timed_out(exc: BaseException) -> bool:
    """A call that got no answer in time (a TLS handshake too), or an attempt out of time;
    not one refused."""
    return isinstance(exc, (TimeoutError, urllib3.exceptions.TimeoutError))
