// The only way the portal talks to Corral: the public REST API under /api/v1, like the CLI.
// Cookie session + CSRF header for requests that change state; a 401 anywhere sends the user to
// the login page and, after login, back to where they were.
// The CSRF token lives in this module's memory only, never in localStorage: where a deployment
// serves workspaces' JupyterLab on this origin (CORRAL_WORKSPACE_PORT=0), script there could read
// any storage of the origin at any later time. After a reload it is read again from GET
// /auth/csrf (session cookie).

const BASE = "/api/v1";
const LEGACY_CSRF_KEY = "corral.csrf"; // where portals before this one kept it: wiped on load
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

export class ApiError extends Error {
  constructor(status, detail, path) {
    super(describeDetail(status, detail));
    this.status = status;
    this.detail = detail;
    this.path = path;
  }

  // Validation errors as [{loc: [...], msg}], with a leading "body"/"query" dropped.
  get fieldErrors() {
    if (this.status !== 422 || !Array.isArray(this.detail)) return [];
    return this.detail.map((e) => ({
      loc: (Array.isArray(e.loc) ? e.loc : [e.loc]).filter((p) => p !== "body" && p !== "query"),
      msg: String(e.msg ?? e.message ?? "invalid value"),
    }));
  }
}

function describeDetail(status, detail) {
  if (typeof detail === "string" && detail) return detail;
  if (Array.isArray(detail)) {
    return detail.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`).join("; ");
  }
  if (detail && typeof detail === "object" && detail.message) return String(detail.message);
  if (status === 0) return "Cannot reach the Corral server.";
  return `The server answered HTTP ${status}.`;
}

let unauthorizedHandler = () => {};
let forbiddenHandler = () => {};

export function onUnauthorized(handler) {
  unauthorizedHandler = handler;
}

// A 403 may mean the user's rights changed since the portal last read them (app.js re-reads /me).
export function onForbidden(handler) {
  forbiddenHandler = handler;
}

let csrfToken = null;
try {
  localStorage.removeItem(LEGACY_CSRF_KEY);
} catch {
  // storage disabled: nothing was kept there either
}

export function setCsrfToken(token) {
  csrfToken = token || null;
}

// The session's CSRF token, read from the server once per page load (or after a refusal).
async function sessionCsrf(signal) {
  if (csrfToken) return csrfToken;
  try {
    const response = await fetch(BASE + "/auth/csrf", {
      headers: { Accept: "application/json" },
      credentials: "same-origin",
      signal,
    });
    if (response.ok) csrfToken = (await response.json()).csrf_token || null;
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
  }
  return csrfToken || "";
}

function isCsrfRefusal(response, payload) {
  const detail = payload && typeof payload === "object" ? payload.detail : payload;
  return response.status === 403 && typeof detail === "string" && detail.includes("X-CSRF-Token");
}

export function buildUrl(path, query) {
  const url = new URL(BASE + path, window.location.origin);
  for (const [key, value] of Object.entries(query || {})) {
    // A list is the parameter repeated (`?label=a=1&label=b=2`, ANDed by the API).
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null && item !== "") url.searchParams.append(key, String(item));
    }
  }
  return url.pathname + url.search;
}

// api("GET", "/jobs", {query: {state: "running"}}) -> parsed JSON (or text), throws ApiError.
export async function api(method, path, options = {}) {
  const { query, json, text, contentType, signal, quiet401 } = options;
  const headers = { Accept: "application/json" };
  let body;
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  } else if (text !== undefined) {
    headers["Content-Type"] = contentType || "text/plain";
    body = text;
  }
  const send = async () => {
    if (!SAFE_METHODS.has(method)) headers["X-CSRF-Token"] = await sessionCsrf(signal);
    let response;
    try {
      response = await fetch(buildUrl(path, query), {
        method,
        headers,
        body,
        credentials: "same-origin",
        signal,
      });
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      throw new ApiError(0, null, path);
    }
    const isJson = (response.headers.get("content-type") || "").includes("json");
    const payload = response.status === 204 ? null : isJson ? await response.json() : await response.text();
    return { response, isJson, payload };
  };
  let { response, isJson, payload } = await send();
  if (!SAFE_METHODS.has(method) && isCsrfRefusal(response, payload)) {
    // The session changed since the token was read (a login in another tab): read it again, once.
    csrfToken = null;
    ({ response, isJson, payload } = await send());
  }
  if (response.status === 401 && !quiet401) {
    unauthorizedHandler();
  }
  if (response.status === 403 && path !== "/me") forbiddenHandler();
  if (!response.ok) {
    throw new ApiError(response.status, isJson && payload ? payload.detail : payload, path);
  }
  return payload;
}

export const get = (path, query, extra) => api("GET", path, { query, ...(extra || {}) });
export const post = (path, json) => api("POST", path, { json: json ?? {} });
export const put = (path, json) => api("PUT", path, { json: json ?? {} });
export const del = (path) => api("DELETE", path);

// Lists come as {items, total} (jobs) or as a bare array (older endpoints): accept both.
export function itemsOf(payload, ...keys) {
  if (Array.isArray(payload)) return payload;
  if (!payload || typeof payload !== "object") return [];
  for (const key of ["items", ...keys]) {
    if (Array.isArray(payload[key])) return payload[key];
  }
  return [];
}
