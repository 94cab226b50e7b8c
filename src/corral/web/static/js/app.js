// The portal shell: session, navigation bar, client-side router and page lifecycle (polling timers
// are owned by the page and stopped when the user navigates away, so nothing polls in the background).

import { ApiError, api, get, onForbidden, onUnauthorized, setCsrfToken } from "./api.js";
import { clear, errorBox, fill, h, toast } from "./ui.js";

const ROUTES = [
  { pattern: /^\/$/, module: "dashboard", title: "Dashboard" },
  { pattern: /^\/login$/, module: "login", title: "Log in", public: true },
  { pattern: /^\/jobs$/, module: "jobs", title: "Jobs" },
  { pattern: /^\/submit$/, module: "submit", title: "Submit a job" },
  { pattern: /^\/jobs\/(\d+)$/, module: "job_detail", title: "Job" },
  { pattern: /^\/nodes$/, module: "nodes", title: "Nodes" },
  { pattern: /^\/groups$/, module: "groups", title: "Groups and quotas" },
  { pattern: /^\/data$/, module: "data", title: "Data" },
  { pattern: /^\/environments$/, module: "environments", title: "Environments" },
  { pattern: /^\/templates$/, module: "templates", title: "Templates" },
  { pattern: /^\/models$/, module: "models", title: "Models" },
  { pattern: /^\/alerts$/, module: "alerts", title: "Alerts" },
  { pattern: /^\/oncall$/, module: "oncall", title: "On-call" },
  { pattern: /^\/usage$/, module: "usage", title: "Usage" },
  { pattern: /^\/profile$/, module: "profile", title: "Profile" },
  { pattern: /^\/audit$/, module: "audit", title: "Audit log" },
  { pattern: /^\/users$/, module: "users", title: "Users" },
  { pattern: /^\/workspaces$/, module: "workspaces", title: "Workspaces" },
  { pattern: /^\/incidents$/, module: "incidents", title: "Incidents" },
  { pattern: /^\/incidents\/(\d+)$/, module: "incidents", title: "Incident" },
];

const NAV = [
  ["/", "Dashboard"],
  ["/jobs", "Jobs"],
  ["/submit", "Submit"],
  ["/workspaces", "Workspaces"],
  ["/nodes", "Nodes"],
  ["/groups", "Groups"],
  ["/data", "Data"],
  ["/environments", "Environments"],
  ["/templates", "Templates"],
  ["/models", "Models"],
  ["/alerts", "Alerts"],
  ["/oncall", "On-call"],
  ["/usage", "Usage"],
  ["/profile", "Profile"],
  ["/audit", "Audit", { adminOnly: true }],
  ["/users", "Users", { adminOnly: true }],
  ["/incidents", "Incidents", { adminOnly: true }],
];

const state = { me: null, meLoading: null, recheckedAt: -Infinity, cleanups: [], renderToken: 0 };
// While the tab is shown, /me is read again this often (besides every navigation, every return
// to the tab and every 403), so a role or group changed meanwhile shows without a reload.
const ME_RECHECK_MS = 5 * 60 * 1000;
// Those background reads (not a navigation's) at most this often: a page polling an endpoint
// that answers 403 read /me once per poll, and a return to the tab (focus, visibilitychange) twice.
const ME_RECHECK_MIN_MS = 10 * 1000;

export function currentUser() {
  return state.me;
}

export function isAdmin() {
  return Boolean(state.me && (state.me.role === "admin" || state.me.is_admin));
}

export function setCurrentUser(me) {
  state.me = me;
  renderTopbar();
}

// ---- navigation ------------------------------------------------------------------------------

export function navigate(path, { replace = false } = {}) {
  if (replace) history.replaceState({}, "", path);
  else history.pushState({}, "", path);
  render();
}

function currentPath() {
  return window.location.pathname + window.location.search;
}

export function goToLogin() {
  const here = currentPath();
  if (window.location.pathname === "/login") return;
  state.me = null;
  navigate(`/login?next=${encodeURIComponent(here)}`, { replace: true });
}

// A 401 from any API call means the session ended (expired, logged out elsewhere).
onUnauthorized(() => {
  if (state.me) toast("Your session has ended; please log in again.", "error");
  goToLogin();
});

document.addEventListener("click", (event) => {
  if (event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey) return;
  const a = event.target.closest("a[href]");
  if (!a || a.target || a.hasAttribute("download")) return;
  const url = new URL(a.href, window.location.href);
  if (url.origin !== window.location.origin || !ROUTES.some((r) => r.pattern.test(url.pathname))) return;
  event.preventDefault();
  navigate(url.pathname + url.search);
});

window.addEventListener("popstate", () => render());

// ---- page lifecycle --------------------------------------------------------------------------

// What a page gets: where to draw, the route's parameters and timers that die with the page.
function makeContext(main, match, token) {
  return {
    main,
    params: match.slice(1),
    query: new URLSearchParams(window.location.search),
    alive: () => token === state.renderToken,
    // Poll fn every ms while this page is shown; a failing poll shows its error once, then retries.
    every(ms, fn) {
      let running = false;
      const id = setInterval(async () => {
        if (running || document.hidden || token !== state.renderToken) return;
        running = true;
        try {
          await fn();
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 401)) console.warn("poll failed", err);
        } finally {
          running = false;
        }
      }, ms);
      state.cleanups.push(() => clearInterval(id));
    },
    onLeave(fn) {
      state.cleanups.push(fn);
    },
  };
}

function stopPage() {
  for (const fn of state.cleanups.splice(0)) {
    try {
      fn();
    } catch (err) {
      console.warn(err);
    }
  }
}

// What of /me decides what the portal shows: the role, the groups with their roles.
function rightsOf(me) {
  if (!me) return "";
  return JSON.stringify([me.name, me.role, me.is_admin, me.default_group, me.groups]);
}

// Read /me (one request at a time); resolves to whether the rights changed.
function readMe({ quiet401 = true } = {}) {
  if (!state.meLoading) {
    const before = rightsOf(state.me);
    state.meLoading = get("/me", undefined, { quiet401 })
      .then((me) => {
        state.me = me;
        return rightsOf(me) !== before;
      })
      .finally(() => {
        state.meLoading = null;
      });
  }
  return state.meLoading;
}

// Every navigation reads /me again (one small request): the page drawn then shows the rights the
// user has now, not those of the login (a group added, a role changed by an admin meanwhile).
async function ensureSession() {
  try {
    await readMe();
    return true;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return false;
    if (state.me) return true; // the server unreachable: the page shows its own error
    throw err;
  }
}

// In the background (back to the tab, a 403, the periodic check): when the rights changed, the
// top bar and the page are drawn again with them.
async function recheckMe() {
  if (!state.me || window.location.pathname === "/login") return;
  const now = Date.now();
  if (now - state.recheckedAt < ME_RECHECK_MIN_MS) return;
  state.recheckedAt = now;
  try {
    if (await readMe({ quiet401: false })) {
      toast("Your roles or groups have changed; the page now shows what you may do.");
      render();
    }
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 401)) console.warn("cannot read /me", err);
  }
}

onForbidden(recheckMe);
window.addEventListener("focus", recheckMe);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) recheckMe();
});
setInterval(() => {
  if (!document.hidden) recheckMe();
}, ME_RECHECK_MS);

export async function render() {
  stopPage();
  const token = ++state.renderToken;
  const main = document.getElementById("main");
  const path = window.location.pathname;
  const route = ROUTES.find((r) => r.pattern.test(path));
  try {
    if (!route) {
      renderTopbar();
      showError(main, 404, `There is no page at ${path}.`);
      return;
    }
    if (!route.public && !(await ensureSession())) {
      goToLogin();
      return;
    }
    if (token !== state.renderToken) return;
    renderTopbar();
    document.title = `${route.title} · Corral`;
    const page = await import(`./pages/${route.module}.js`);
    if (token !== state.renderToken) return;
    clear(main);
    main.dataset.page = route.module;
    await page.render(makeContext(main, path.match(route.pattern), token));
  } catch (err) {
    if (token !== state.renderToken) return;
    if (err instanceof ApiError && err.status === 401) return; // already on the way to login
    if (err instanceof ApiError && (err.status === 403 || err.status === 404)) {
      showError(main, err.status, err.message);
    } else {
      fill(main, h("h1", {}, "Error"), errorBox(err));
    }
  }
  if (token === state.renderToken && document.activeElement === document.body) main.focus({ preventScroll: true });
}

// A proper 403/404 page (never a stack trace).
export function showError(main, status, message) {
  const titles = { 403: "403 — Forbidden", 404: "404 — Not found" };
  const hints = {
    403: "You do not have permission to see this. Ask an admin of its group if you need access.",
    404: "It may have been deleted, or the address is mistyped.",
  };
  document.title = `${titles[status] || status} · Corral`;
  main.dataset.page = `error-${status}`;
  fill(main, 
    h(
      "div",
      { class: "error-page", "data-status": status },
      h("h1", {}, titles[status] || `Error ${status}`),
      h("p", {}, message || ""),
      h("p", { class: "muted" }, hints[status] || ""),
      h("p", {}, h("a", { href: "/", class: "button" }, "Back to the dashboard")),
    ),
  );
}

// ---- top bar -----------------------------------------------------------------------------------

function renderTopbar() {
  const bar = document.getElementById("topbar");
  if (!state.me || window.location.pathname === "/login") {
    bar.hidden = true;
    clear(bar);
    return;
  }
  bar.hidden = false;
  const path = window.location.pathname;
  const active = (href) => (href === "/" ? path === "/" : path === href || path.startsWith(href + "/"));
  fill(bar, 
    h("a", { href: "/", class: "brand" }, h("span", { class: "brand-mark", "aria-hidden": "true" }), "Corral"),
    h(
      "nav",
      { "aria-label": "Main" },
      h(
        "ul",
        {},
        NAV.filter(([, , opts]) => !opts?.adminOnly || isAdmin()).map(([href, label]) =>
          h("li", {}, h("a", { href, "aria-current": active(href) ? "page" : undefined }, label)),
        ),
      ),
    ),
    h(
      "div",
      { class: "whoami" },
      h("span", { class: "user-name", title: "Logged in as" }, state.me.name),
      isAdmin() ? h("span", { class: "badge role-admin" }, "admin") : null,
      h("button", { type: "button", class: "button subtle", id: "logout", onclick: logout }, "Log out"),
    ),
  );
}

async function logout() {
  try {
    await api("POST", "/auth/logout", { json: {}, quiet401: true });
  } catch (err) {
    // Ending the session locally is what matters; the server's session expires anyway.
    console.warn(err);
  }
  setCsrfToken(null);
  state.me = null;
  navigate("/login", { replace: true });
}

render();
