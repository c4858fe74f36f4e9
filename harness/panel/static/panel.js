// The panel's only script: show each timestamp in the viewer's local time (UTC stays on hover).
document.querySelectorAll("time[datetime]").forEach(function (t) {
  var when = new Date(t.getAttribute("datetime"));
  if (!isNaN(when.getTime())) {
    t.textContent = when.toLocaleString();
  }
});
