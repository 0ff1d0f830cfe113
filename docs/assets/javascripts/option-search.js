// A command-line option finds its guide: a search for `--resume` looks up `resume`.
// The search (lunr) reads a leading `-` as "must not contain", so `--resume` was an
// invalid query that found nothing. Each word's two or more leading dashes are taken off
// the query the page posts to the search worker ({type: 2, data: query}); a single dash
// stays, for lunr's exclusion (`send -resume`). Wrapping the prototype's method reaches the
// worker the theme has already made, the browser's Worker or, from file://, the
// iframe-worker shim's (mkdocs.yml, extra.polyfills).
"use strict";
(() => {
  if (typeof Worker === "undefined") return;
  const post = Worker.prototype.postMessage;
  Worker.prototype.postMessage = function (message, ...rest) {
    if (message && message.type === 2 && typeof message.data === "string") {
      message = { ...message, data: message.data.replace(/(^|\s)-{2,}/g, "$1") };
    }
    return post.call(this, message, ...rest);
  };
})();
