// Runs programs through the npm `piston-client`, unchanged, and prints what it got back as
// JSON, one object per case. Usage: node piston_cases.mjs CLIENT_INDEX_JS SERVER_URL
const [clientPath, server] = process.argv.slice(2);
const { default: piston } = await import(clientPath);
const client = piston({ server });

const cpp = "#include <iostream>\nint main(int argc, char** argv){int a,b;std::cin>>a>>b;std::cout<<a+b<<' '<<argc-1<<std::endl;}\n";
const cases = {
  runtimes: null,
  python_args: ["python", "import sys\nprint(sys.argv[1:], input())", { stdin: "hi\n" }],
  cpp_sum: ["c++", cpp, { stdin: "40 2" }],
  javascript: ["javascript", "console.log(6 * 7)", {}],
  java: ["java", "public class Sum { public static void main(String[] a) { System.out.println(a.length + 39); } }", {}],
  compile_error: ["c++", "int main() { return missing; }", {}],
  time_limit: ["python", "while True: pass", { runTimeout: 1000 }],
  segfault: ["c", "int main(){ volatile int *p = 0; return *p; }", {}],
  exit_code: ["python", "raise SystemExit(3)", {}],
  memory: ["python", "x = bytearray(300 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('ok')", { runMemoryLimit: 64 * 1024 * 1024 }],
  memory_roomy: ["python", "x = bytearray(100 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\nprint('ok')", { runMemoryLimit: 512 * 1024 * 1024 }],
  unknown_version: ["python", "print(1)", { version: "0.0.1" }],
};
const out = {};
for (const [name, args] of Object.entries(cases)) {
  out[name] = args === null ? await client.runtimes() : await client.execute(...args);
}
console.log(JSON.stringify(out));
