// One POST to qkv view's JSON API, shared by both pages (app.js: a text; document.js: a long
// document). Identical requests in flight share one promise; an error answer becomes an Error
// naming its field ("field: message"), as the API's 4xx bodies give them.
"use strict";

const qkvPost = (() => {
  const inflight = new Map();
  return function (endpoint, body) {
    const key = endpoint + body;
    if (inflight.has(key)) return inflight.get(key);
    const p = fetch("api/" + endpoint, { method: "POST", headers: { "Content-Type": "application/json" }, body })
      .then(async (r) => {
        const data = await r.json();
        if (!r.ok) {
          const e = data.error || {};
          throw new Error((e.field ? e.field + ": " : "") + (e.message || r.statusText));
        }
        return data;
      })
      .finally(() => inflight.delete(key));
    inflight.set(key, p);
    return p;
  };
})();
