// The JS SDK's methods that reach past the build context: image helpers through the docker.io
// mirror, a private registry with credentials, the package and clone helpers against loopback
// servers, port and URL ready commands, forceUpload, and the build's resources.
// Usage: node sweep_network.mjs CONTEXT_DIR PRIVATE_IMAGE PASSWORD GCP_IMAGE PACKAGES_URL PORT URL_PORT
// (CONTEXT_DIR/sa.json holds the GCP service-account key)
// (E2B_API_KEY and E2B_API_URL in the environment). Prints one JSON object on the last line;
// the effects inside the templates are checked by test_js_sdk.py.
import { Template, waitForPort, waitForURL } from 'e2b'

const [contextDir, privateImage, password, gcpImage, packages, port, urlPort] = process.argv.slice(2)
const opts = { apiKey: process.env.E2B_API_KEY, apiUrl: process.env.E2B_API_URL }
const out = {}

async function build(template, name, extra = {}) {
  const logs = []
  await Template.build(template, name, { ...opts, onBuildLogs: (e) => logs.push(e.message), ...extra })
  return logs
}

async function failure(template, name, extra = {}) {
  try {
    await Template.build(template, name, { ...opts, ...extra })
    return null
  } catch (err) {
    return `${err.name}: ${err.message}`
  }
}

const SEEN = 'cat /etc/image-marker > /home/user/seen'
// One 300 MiB buffer, filled.
const FILL_300_MIB = 'dd if=/dev/zero of=/dev/null bs=300M count=1'
const serve = (p) => `cd /home/user && exec python3 -u -m http.server ${p} > /home/user/http.log 2>&1`

try {
  // Every image helper by its default variant (the mirror serves each); the bun image's `bun`
  // is a stand-in that records its calls.
  const helpers = {
    debian: (t) => t.fromDebianImage(),
    ubuntu: (t) => t.fromUbuntuImage(),
    fedora: (t) => t.fromFedoraImage(),
    alpine: (t) => t.fromAlpineImage(),
    arch: (t) => t.fromArchImage(),
    python: (t) => t.fromPythonImage(),
    node: (t) => t.fromNodeImage(),
    bun: (t) =>
      t
        .fromBunImage()
        .bunInstall(['left-pad', 'zod'])
        .bunInstall('tsx', { g: true })
        .bunInstall(undefined, { dev: true }),
  }
  const copyTemplate = (forceUpload) =>
    Template({ fileContextPath: contextDir })
      .fromImage('busybox')
      .copy('app/nested', '/opt/nested', { forceUpload })
  const uploads = (logs) => logs.filter((m) => m === "Uploaded 'app/nested'").length

  const jobs = {
    helpers: Promise.all(
      Object.entries(helpers).map(([name, make]) => build(make(Template()).runCmd(SEEN), `js-helper-${name}`)),
    ),
    private: build(Template().fromImage(privateImage, { username: 'builder', password }).runCmd(SEEN), 'js-private'),
    privateWrong: failure(
      Template().fromImage(privateImage, { username: 'builder', password: 'wrong-Pa55word-js' }).runCmd('true'),
      'js-private-bad',
    ),
    gcp: build(
      Template({ fileContextPath: contextDir })
        .fromGCPRegistry(gcpImage, { serviceAccountJSON: 'sa.json' })
        .runCmd(SEEN),
      'js-gcp',
    ),
    tools: build(
      Template()
        .fromBaseImage()
        .aptInstall(['tree'], { noInstallRecommends: true })
        // The options the Python test leaves at their defaults: for the user, and globally.
        .pipInstall([`${packages}/stratacheck-1.0-py3-none-any.whl`], { g: false })
        .npmInstall(['--no-audit', '--no-fund', `${packages}/strata-check-1.0.0.tgz`], { g: true })
        .gitClone(`${packages}/repo.git`, '/home/user/repo', { branch: 'main' }),
      'js-tools',
    ),
    port: build(Template().fromBaseImage().setStartCmd(serve(port), waitForPort(Number(port))), 'js-port'),
    url: build(
      Template().fromBaseImage().setStartCmd(serve(urlPort), waitForURL(`http://localhost:${urlPort}/`)),
      'js-url',
    ),
    // The deprecated options-object form names the template by `alias`.
    sized: Template.build(Template().fromImage('busybox').runCmd(`${FILL_300_MIB} && echo sized > /home/user/sized`), {
      ...opts,
      alias: 'js-sized',
      cpuCount: 1,
      memoryMB: 512,
      minFreeDiskMb: 256,
    }),
    starved: failure(Template().fromImage('busybox').runCmd(FILL_300_MIB), 'js-starved', { memoryMB: 256 }),
    // forceUpload: the second build uploads the unchanged files again. The build option
    // skipCache: the third runs its COPY again, from the files already uploaded.
    force: build(copyTemplate(false), 'js-force').then(async (first) => {
      const forced = await build(copyTemplate(true), 'js-force')
      const skipped = await build(copyTemplate(false), 'js-force', { skipCache: true })
      return {
        uploads: [uploads(first), uploads(forced), uploads(skipped)],
        skippedSteps: skipped.filter((m) => /^\[\d+\/\d+\] /.test(m)),
      }
    }),
  }
  const results = await Promise.all(Object.values(jobs))
  Object.keys(jobs).forEach((key, i) => (out[key] = results[i]))
  out.helpers = Object.fromEntries(
    Object.keys(helpers).map((name, i) => [name, out.helpers[i].filter((m) => m.startsWith('[base] '))]),
  )
  out.tools = out.tools.length
  out.port = out.port.filter((m) => m.startsWith('[finalize]'))
  out.url = out.url.filter((m) => m.startsWith('[finalize]'))
  out.sized = out.sized.name
  out.private = out.private.filter((m) => m.startsWith('[base] '))
  out.gcp = out.gcp.filter((m) => m.startsWith('[base] '))
} catch (err) {
  console.error(`${err.name}: ${err.message}`)
  console.error(JSON.stringify(out))
  process.exit(1)
}
console.log(JSON.stringify(out))
