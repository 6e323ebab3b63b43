"""`--ray [auto|local|ADDRESS]`: connect to (or start) a Ray cluster for `rcdiag score` and `rcdiag report`.

Ray is optional (`pip install 'rcdiag[ray]'`); nothing here imports it until a command asks for it.

    auto     join the cluster of this machine (RAY_ADDRESS or a running `ray start`), else start a local one
    local    always start a private local cluster on this machine
    ADDRESS  join that cluster: `ray://head:10001` (Ray Client) or `head:6379` (a node of the cluster)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from rcdiag.errors import ConfigError

RAY_HELP = ("Run on Ray: auto (this machine's cluster, else a local one) | local (a private local cluster) | "
            "ADDRESS (ray://head:10001 or head:6379). Needs pip install 'rcdiag[ray]'.")
INSTALL_HINT = "pip install 'rcdiag[ray]'"


def require_ray() -> Any:
    """The `ray` module; ConfigError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def parse_address(value: str) -> str | None:
    """The `address` for ray.init: "auto" → "auto", "local" → None (start a new cluster), else the address.
    Raises ConfigError on an empty value."""
    text = value.strip()
    if not text:
        raise ConfigError("--ray: give auto, local or a cluster address (ray://head:10001 or head:6379)")
    if text.lower() == "local":
        return None
    return "auto" if text.lower() == "auto" else text


def _init(ray: Any, value: str) -> None:
    address = parse_address(value)
    if address == "auto":
        try:
            ray.init(address="auto", log_to_driver=False)
            return
        except ConnectionError:
            address = None  # no cluster on this machine: start one
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, ValueError) as exc:
        raise ConfigError(f"--ray {value}: cannot connect to a Ray cluster there ({exc})") from None


@contextlib.contextmanager
def ray_session(value: str) -> Iterator[Any]:
    """Yield the `ray` module connected as `value` says. A cluster already initialised in this process (e.g. by
    a notebook or a test) is used as is and left running; one started here is shut down on exit."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    _init(ray, value)
    try:
        yield ray
    finally:
        ray.shutdown()
