/* Chasqui console: the few behaviours htmx does not cover.
 *
 * - Live status: htmx's ws extension keeps the socket; this tracks its state
 *   in <html data-live> and the pill in the top bar. While no socket is open
 *   (refused, blocked by a proxy, reconnecting) the page polls the same
 *   fragments over HTTP: the poller's hx-trigger asks chasquiShouldPoll().
 * - A session that expired (close code 4401) sends the tab to the login page.
 * - "Tick the page" checkbox and the ticked count of the DLQ table.
 * - data-confirm on a form asks before submitting.
 * - A DLQ search's Stop button ends the chain of requests that fills its list.
 */
(function () {
  "use strict";

  var LABELS = { connecting: "Connecting…", ws: "Live", poll: "Polling", off: "Offline", denied: "No access" };
  var state = document.documentElement.dataset.live || "static";

  function setState(next) {
    var wasPolling = state === "poll" || state === "off";
    state = next;
    document.documentElement.dataset.live = next;
    var pill = document.getElementById("live-pill");
    if (pill) {
      pill.dataset.state = next;
      pill.textContent = LABELS[next] || next;
    }
    // The page's first paint has placeholders for its live parts: fill them now, not two seconds later.
    var poller = document.querySelector("[data-poller]");
    if (poller && window.htmx && !wasPolling && (next === "poll" || next === "off")) window.htmx.trigger(poller, "chasqui-poll");
  }

  window.chasquiShouldPoll = function () {
    return state === "poll" || state === "off";
  };

  document.addEventListener("htmx:wsOpen", function () { setState("ws"); });
  document.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail && event.detail.event ? event.detail.event.code : 0;
    if (code === 4401) {
      var login = document.body.dataset.loginUrl || "/login/";
      window.location.assign(login + "?next=" + encodeURIComponent(location.pathname + location.search));
      return;
    }
    setState(code === 4403 ? "denied" : "poll");
  });
  document.addEventListener("htmx:wsError", function () {
    if (state !== "denied") setState("poll");
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    var elt = event.detail && event.detail.elt;
    if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-poller") || state === "ws") return;
    setState(event.detail.successful ? "poll" : "off");
  });

  if (state === "connecting") {
    if (!("WebSocket" in window)) {
      setState("poll");
    } else {
      // A socket that neither opens nor fails (some proxies hold it) must not leave the page frozen.
      setTimeout(function () { if (state === "connecting") setState("poll"); }, 4000);
    }
  }

  function updateTicked(form) {
    var boxes = form.querySelectorAll('input[type=checkbox][name=ids]');
    var ticked = 0;
    boxes.forEach(function (b) { if (b.checked) ticked += 1; });
    var counter = form.querySelector("[data-selected-count]");
    if (counter) counter.textContent = ticked + " ticked";
    var all = form.querySelector("[data-select-all]");
    if (all) {
      all.checked = boxes.length > 0 && ticked === boxes.length;
      all.indeterminate = ticked > 0 && ticked < boxes.length;
    }
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    var form = target.form;
    if (!form) return;
    if (target.hasAttribute("data-select-all")) {
      form.querySelectorAll('input[type=checkbox][name=ids]').forEach(function (b) { b.checked = target.checked; });
    }
    if (target.hasAttribute("data-select-all") || target.name === "ids") updateTicked(form);
  });

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) event.preventDefault();
  });

  document.addEventListener("click", function (event) {
    var stop = event.target.closest ? event.target.closest("[data-search-stop]") : null;
    if (!stop) return;
    var next = document.getElementById("search-next");
    if (next) {
      if (window.htmx) window.htmx.trigger(next, "htmx:abort");
      next.remove();
    }
    var state = document.getElementById("search-state");
    if (state) state.textContent = "stopped";
    stop.disabled = true;
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form.bulk").forEach(updateTicked);
  });
})();
