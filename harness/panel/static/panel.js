// The panel's only script: every timestamp reads as ISO-8601 UTC; hovering one shows the
// viewer's local time (its title), which only the browser knows.
document.querySelectorAll("time[datetime]").forEach(function (t) {
  var when = new Date(t.getAttribute("datetime"));
  if (!isNaN(when.getTime())) {
    t.title = "local time: " + when.toLocaleString(undefined, { timeZoneName: "short" });
  }
});
