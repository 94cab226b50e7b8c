// Log in with username and password; the server sets the session cookie and returns the CSRF
// token that every state-changing request sends back. Afterwards go back to where the user was.

import { ApiError, api, get, setCsrfToken } from "../api.js";
import { navigate, setCurrentUser } from "../app.js";
import { h } from "../ui.js";

// Only same-site paths: `next` comes from the address bar, so never follow it off-site.
function safeNext(value) {
  if (!value || !value.startsWith("/") || value.startsWith("//") || value.startsWith("/login")) return "/";
  return value;
}

export async function render(ctx) {
  const next = safeNext(ctx.query.get("next"));
  const message = h("div", { id: "login-error", class: "error-box", role: "alert", hidden: true });
  const username = h("input", { id: "username", name: "username", autocomplete: "username", required: true });
  const password = h("input", {
    id: "password",
    name: "password",
    type: "password",
    autocomplete: "current-password",
    required: true,
  });
  const submit = h("button", { type: "submit", class: "button primary" }, "Log in");
  const form = h(
    "form",
    { class: "login-form card", novalidate: true },
    h("h1", {}, h("span", { class: "brand-mark", "aria-hidden": "true" }), "Corral"),
    h("p", { class: "muted" }, "Log in to the GPU cluster portal."),
    message,
    h("div", { class: "field" }, h("label", { for: "username" }, "Username"), username),
    h("div", { class: "field" }, h("label", { for: "password" }, "Password"), password),
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.hidden = true;
    if (!username.value.trim() || !password.value) {
      message.textContent = "Enter your username and password.";
      message.hidden = false;
      (username.value.trim() ? password : username).focus();
      return;
    }
    submit.disabled = true;
    try {
      const result = await api("POST", "/auth/login", {
        json: { username: username.value.trim(), password: password.value },
        quiet401: true,
      });
      setCsrfToken(result && result.csrf_token);
      setCurrentUser(await get("/me"));
      // A workspace's JupyterLab (/ws/<id>/...) is served by the proxy, not by this app.
      if (next.startsWith("/ws/")) window.location.assign(next);
      else navigate(next, { replace: true });
    } catch (err) {
      const bad = err instanceof ApiError && (err.status === 401 || err.status === 403 || err.status === 400);
      message.textContent = bad ? "Wrong username or password." : err.message;
      message.hidden = false;
      password.select();
      password.focus();
    } finally {
      submit.disabled = false;
    }
  });
  ctx.main.append(h("div", { class: "login-wrap" }, form));
  username.focus();
}
