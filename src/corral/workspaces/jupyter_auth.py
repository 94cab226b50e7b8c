"""JupyterLab's identity provider inside a workspace: a request is authenticated when it carries
the header Corral's proxy adds (`X-Corral-Workspace-Token`, the per-start credential), and by
nothing else: no Jupyter token in URLs, cookies or JupyterLab's page config, so the browser never
sees a credential of Jupyter's; Corral's own session is what the proxy checks.

Imported by JupyterLab inside the sandbox (corral.workspaces.launch); keep it small."""

from __future__ import annotations

import hmac
import os
from typing import Any, ClassVar

from jupyter_server.auth.identity import IdentityProvider, User

HEADER = "X-Corral-Workspace-Token"


class CorralIdentityProvider(IdentityProvider):
    secret: ClassVar[str] = ""  # set by corral.workspaces.launch before JupyterLab starts

    def get_user(self, handler: Any) -> User | None:
        sent = handler.request.headers.get(HEADER, "")
        if not self.secret or not hmac.compare_digest(sent.encode(), self.secret.encode()):
            return None
        # Like a token login: no XSRF cookie or Origin check inside (the proxy checks the origin).
        handler._token_authenticated = True
        return User(username=os.environ.get("USER", "user"))

    def is_token_authenticated(self, handler: Any) -> bool:
        handler.current_user  # noqa: B018 (runs get_user once)
        return bool(getattr(handler, "_token_authenticated", False))
