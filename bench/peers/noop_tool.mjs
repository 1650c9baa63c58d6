// A loopback no-op HTTP tool for the server path of `make bench-peers`:
// answers every request 200 with {} (a write that honours keys has nothing
// more to do when it does nothing). Prints its port, then serves until
// killed.
//
//   node noop_tool.mjs PORT
import http from "node:http";

const port = Number(process.argv[2] || 0);
const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", () => {
    res.writeHead(200, { "content-type": "application/json", "content-length": "2" });
    res.end("{}");
  });
});
server.keepAliveTimeout = 60_000;
server.listen(port, "127.0.0.1", () => console.log(server.address().port));
