// Talking to the server: every call resolves (never rejects). A failure shows its message in
// the alert banner and resolves to null, so no handler can throw an unhandled rejection.

const alertBox = () => document.getElementById("alert");

export function showError(message) {
  const box = alertBox();
  document.getElementById("alert-text").textContent = message;
  box.hidden = false;
}

export function clearError() {
  alertBox().hidden = true;
}

export async function call(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  let response;
  try {
    response = await fetch(path, options);
  } catch (err) {
    showError(`cannot reach the viewer (${err.message}); is glassllm view still running?`);
    return null;
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    showError(data && data.error ? data.error : `the server answered ${response.status}`);
    return null;
  }
  if (data === null) showError("the server's answer was not JSON");
  return data;
}
