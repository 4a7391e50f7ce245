"""The local run: a Ray head and Serve on this machine, started, guarded and stopped by the CLI.

`platform` starts the head, deploys the apps (the same Serve config document a RayService gets),
waits for them and stops them; `ray_access` keeps Ray's ports on loopback behind a token;
`haproxy_loopback` keeps Serve's HAProxy ingress there too; `leftovers` stops what a killed Ray
leaves behind (HAProxy, vLLM engine cores).
"""
