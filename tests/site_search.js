// The built site's own search: Material's search worker, run in node on the site's index.
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

async function answer(message) {
  handle({ data: message });
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
