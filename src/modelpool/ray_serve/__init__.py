"""modelpool on Ray Serve: the same API and catalog across the nodes of a Ray cluster.

An ingress deployment runs modelpool's own FastAPI app over a `RemotePool`; every served model
(or multiplexed group of models) is a Ray Serve application whose replicas each run a
`ModelPool` of their own over that model. `deploy.deploy(config)` puts them on a cluster;
`modelpool serve --ray` and `modelpool ray ...` call it.

Ray is optional (`pip install 'modelpool[ray]'`): only this package imports it, and nothing
outside it imports this package except the `ray` CLI commands.
"""

from __future__ import annotations

INSTALL_HINT = "Ray mode needs Ray Serve: pip install 'modelpool[ray]' (or make install-ray)"
