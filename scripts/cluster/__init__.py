"""A local Kubernetes control plane on loopback for contributors, CI and the cluster test tier.

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built once from their own Go
modules and cached; KWOK plays the kubelets of fake GPU and CPU nodes. Run it with
``python -m scripts.cluster {build,up,down,status,env}`` or ``make cluster`` / ``make cluster-down``.

- :mod:`.build` — Go builds of the binaries and their cache.
- :mod:`.pki` — CA, serving and client certificates, service-account keys.
- :mod:`.procs` — detached processes, pidfiles, stopping them.
- :mod:`.kube` — a tiny HTTPS client for the API server (admin client certificate).
- :mod:`.kwok` — KWOK's stages and the fake nodes.
- :mod:`.controlplane` — ``up``/``down``/``status``: the whole thing, and the ``Cluster`` it returns.
"""
