/*
 * A link to one notebook (lab/index.html?path=NN_slug/name.ipynb, as the book's "Try it
 * in your browser" links are) opens that notebook and only it. JupyterLab would first
 * restore the tabs this browser had open last time (another chapter's notebook, with a
 * kernel of its own starting): JupyterLite keeps that layout as the workspace "default"
 * in the "statedb" store of its IndexedDB database ("JupyterLite Storage - " and the
 * site's path). When the address names a notebook, this script deletes that saved
 * layout (never a file) before JupyterLab starts: scripts/build_lite.py loads it first
 * in lab/index.html and makes the page's start wait for window.kvlibOpenOnly. A reload
 * of the page once it is open (the address then has no ``path``) restores the tabs as
 * usual.
 */
(function () {
  "use strict";
  const WORKSPACE = "default"; // lab/index.html's workspace
  const STORE = "statedb";
  const LIMIT_MS = 3000; // never hold the page longer than this

  function request(req) {
    return new Promise((resolve, reject) => {
      req.onsuccess = () => resolve(req.result);
      req.onerror = () => reject(req.error);
    });
  }

  async function forgetLayout() {
    const root = new URL("..", window.location.href).pathname; // the lite site's root
    const name = "JupyterLite Storage - " + root;
    const known = await indexedDB.databases();
    if (!known.some((db) => db.name === name)) return false; // first visit
    const db = await request(indexedDB.open(name));
    try {
      if (!db.objectStoreNames.contains(STORE)) return false;
      const done = new Promise((resolve, reject) => {
        const tx = db.transaction(STORE, "readwrite");
        tx.objectStore(STORE).delete(WORKSPACE);
        tx.oncomplete = () => resolve(true);
        tx.onerror = () => reject(tx.error);
      });
      return await done;
    } finally {
      db.close();
    }
  }

  const url = new URL(window.location.href);
  const opening = url.searchParams.has("path") ? forgetLayout() : Promise.resolve(false);
  const limit = new Promise((resolve) => window.setTimeout(() => resolve(false), LIMIT_MS));
  window.kvlibOpenOnly = Promise.race([opening, limit]).catch((err) => {
    console.warn("open-only:", err);
    return false;
  });
})();
