"""Interactive workspaces' runtime parts: what runs inside the workspace's sandbox (`launch`,
`jupyter_auth`), where the server reaches it (`endpoint`) and the server's reverse proxy (`proxy`).
The workspace objects themselves are corral.services.workspaces."""
