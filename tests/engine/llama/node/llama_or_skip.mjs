// llama_or_skip.mjs: the checks' one way to get llama.cpp — node-llama-cpp's
// prebuilt CPU build, offline — or exit 77 (skip) where it cannot load here.
export async function llamaOrSkip() {
    let getLlama;
    try {
        ({ getLlama } = await import("node-llama-cpp"));
    } catch (e) {
        console.log(`node-llama-cpp unavailable (${e.message}): skip`);
        process.exit(77);
    }
    try {
        return await getLlama({ gpu: false, build: "never", logLevel: "error" });
    } catch (e) {
        console.log(`no prebuilt llama.cpp for this machine (${e.message}): skip`);
        process.exit(77);
    }
}
