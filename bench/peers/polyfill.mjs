// Promise.withResolvers, which the Restate SDK calls, is in Node 22; the
// machine's Node is 20. Imported before the SDK.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
