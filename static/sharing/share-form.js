// The chat sidebar's "Share conversation": shares the conversation in the address bar (a new chat
// gets its id after the first answer, without a reload) and exactly the messages on screen, in
// their order -- with branches, the ones shown, not every version.
(function () {
  "use strict";
  const form = document.getElementById("share-form");
  if (!form) return;
  const button = document.getElementById("share-button");
  const currentId = () => (/^\/c\/(\d+)\//.exec(location.pathname) || [])[1] || form.elements.conversation.value;
  const refresh = () => { button.hidden = !currentId(); };
  refresh();
  // chat.js moves a new conversation to /c/<id>/ with history.replaceState, which fires no event.
  setInterval(refresh, 1000);
  form.addEventListener("submit", (event) => {
    const id = currentId();
    if (!id) { event.preventDefault(); return; }
    form.elements.conversation.value = id;
    form.elements.messages.value = [...document.querySelectorAll("#messages .message[data-id]")]
      .map((el) => el.dataset.id).join(",");
  });
})();
