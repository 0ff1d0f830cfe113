// The built site's own search: Material's search worker, run in node on the site's index,
// given each query the way a page opened from file:// gives it.
// Usage: node site_search.js SITE QUERY...; prints {query: [page, ...]}, best first.
"use strict";
const fs = require("fs");
const path = require("path");
const vm = require("vm");

const [site, ...queries] = process.argv.slice(2);
const workers = path.join(site, "assets", "javascripts", "workers");
const worker = fs.readdirSync(workers).find((name) => /^search\..*\.min\.js$/.test(name));
let handle = null;
const answers = [];
const context = {
  addEventListener: (_, fn) => { handle = fn; },
  postMessage: (message) => answers.push(message),
  importScripts: () => {},  // other languages only; the site is in English
  console,
  setTimeout,
};
context.self = context;
vm.createContext(context);
vm.runInContext(fs.readFileSync(path.join(workers, worker), "utf8"), context);
vm.runInContext(
  fs.readFileSync(path.join(site, "search", "search_index.js"), "utf8") + ";self.__index = __index;",
  context,
);

// The page: every script it loads but the theme's bundle (the user interface, whose part
// here is to post the messages). From file://, the iframe-worker shim is its Worker: its
// iframe stands in below, handing each message on to the worker above.
const frame = {
  document: { open() {}, write() {}, close() { setTimeout(() => frame.onload()); } },
  dispatchEvent: (event) => handle(event),
};
const page = {
  location: { protocol: "file:" },
  document: {
    createElement: () => ({ contentWindow: frame }),
    body: { appendChild: (element) => element },
  },
  onmessage: null,
  onerror: null,
  EventTarget,
  MessageEvent,
  structuredClone,
  console,
};
page.window = page;
vm.createContext(page);
const html = fs.readFileSync(path.join(site, "index.html"), "utf8");
for (const [, src] of html.matchAll(/<script src="([^"]+)"/g)) {
  if (!/\/bundle\.[^/]*\.min\.js$/.test(src)) {
    vm.runInContext(fs.readFileSync(path.join(site, src), "utf8"), page);
  }
}
const searching = new page.Worker(path.join(workers, worker));

async function answer(message) {
  searching.postMessage(message);
  while (!answers.length) await new Promise((resolve) => setTimeout(resolve, 1));
  return answers.shift();
}

(async () => {
  // As the page sets it up: the index, and the theme's options.
  await answer({ type: 0, data: { ...context.__index, options: { suggest: false } } });
  const found = {};
  for (const query of queries) {
    const { data } = await answer({ type: 2, data: query });
    found[query] = data.items.map((sections) => sections[0].location.split("#")[0]);
  }
  process.stdout.write(JSON.stringify(found));
})();
