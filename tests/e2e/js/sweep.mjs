// Every public builder method and build-related function of the stock E2B JS SDK that needs
// nothing past the build context, in a few builds (sweep_network.mjs has the others).
// Usage: node sweep.mjs CONTEXT_DIR (E2B_API_KEY and E2B_API_URL in the environment).
// Prints one JSON object on the last line: what each call returned and which steps each build
// executed. The effects inside the templates are checked by test_js_sdk.py.
import {
  Template,
  defaultBuildLogger,
  waitForFile,
  waitForProcess,
  waitForTimeout,
} from 'e2b'

const [contextDir] = process.argv.slice(2)
const opts = { apiKey: process.env.E2B_API_KEY, apiUrl: process.env.E2B_API_URL }
const STEP = /^\[(\d+)\/(\d+)\] (CACHED )?(RUN|COPY|ENV|WORKDIR|USER) /
const out = {}

async function build(template, name, extra = {}) {
  const logs = []
  const info = await Template.build(template, name, {
    ...opts,
    onBuildLogs: (entry) => logs.push(entry.message),
    ...extra,
  })
  const executed = logs
    .map((m) => STEP.exec(m))
    .filter((m) => m && !m[3])
    .map((m) => Number(m[1]))
  return { info, logs, executed }
}

async function failure(template, name) {
  try {
    await Template.build(template, name, opts)
    return null
  } catch (err) {
    return `${err.name}: ${err.message}`
  }
}

// wait_for_process runs `pgrep`, which busybox lacks: a stand-in on its `pidof`.
const PGREP =
  "mkdir -p /usr/local/bin && printf '%s\\n' '#!/bin/sh' 'exec pidof \"$1\"' > /usr/local/bin/pgrep" +
  ' && chmod 755 /usr/local/bin/pgrep'
// A tool stand-in that records who called it with what.
const recorder = (tool) =>
  `mkdir -p /usr/local/bin /var/log && printf '%s\\n' '#!/bin/sh' 'echo "$(id -un) $0 $*" >> /var/log/${tool}.calls' > /usr/local/bin/${tool} && chmod 755 /usr/local/bin/${tool}`

function filesRecipe() {
  return Template({ fileContextPath: contextDir, fileIgnorePatterns: ['notes/c.txt'] })
    .fromImage('busybox')
    .runCmd(PGREP, { user: 'root' })
    .copy(['notes/a.md', 'notes/b.md'], '/opt/multi/', { user: 'root', mode: 0o640 })
    .copy('app/link.txt', '/opt/resolved.txt', { resolveSymlinks: true })
    .copy('notes', '/opt/notes-plain', { gzip: false })
    .copyItems([
      { src: 'app/config.txt', dest: '/opt/items/config.txt', mode: 0o600 },
      { src: 'app/bin/run.sh', dest: '/opt/items/run.sh', user: 'root' },
    ])
    .makeDir(['/home/user/d1', '/home/user/d2'], { mode: 0o711 })
    .makeDir('/opt/rootdir', { user: 'root' })
    .makeSymlink('/opt/items/config.txt', '/home/user/cfg-link')
    .makeSymlink('/opt/multi/a.md', '/home/user/cfg-link', { force: true })
    .runCmd(['echo a > /home/user/d1/x', 'echo b > /home/user/d1/y'])
    .rename('/home/user/d1/x', '/home/user/d1/x-renamed')
    .rename('/home/user/d1/y', '/home/user/d1/x-renamed', { force: true })
    .remove('/home/user/d2', { recursive: true, force: true })
    .remove('/opt/rootdir', { recursive: true, user: 'root' })
    .setUser('root')
    .runCmd('id -un > /opt/whoami-step')
    .setUser('user')
    .runCmd('id -un > /tmp/run-as', { user: 'root' })
    .setEnvs({ SWEEP_DIR: 'work', SWEEP_MSG: 'from-env' })
    .setWorkdir('$SWEEP_DIR')
    .runCmd('echo "$SWEEP_MSG $(pwd)" > env-and-pwd')
    .skipCache()
    .runCmd('echo forced > /home/user/forced')
    .setStartCmd('echo started > /home/user/started && exec tail -f /dev/null', waitForProcess('tail'))
}

try {
  // Files, users, workdir, env, skipCache, start/ready, tags.
  const files = await build(filesRecipe(), 'js-files', { tags: ['v1', 'v2'] })
  out.files = { executed: files.executed, templateId: files.info.templateId, buildId: files.info.buildId }
  out.exists = await Template.exists('js-files', opts)
  out.aliasExists = await Template.aliasExists('js-files', opts)
  out.missingExists = await Template.exists('js-missing', opts)
  out.tagsAfterBuild = (await Template.getTags(files.info.templateId, opts)).map((t) => t.tag)
  out.assigned = await Template.assignTags('js-files:v1', ['stable'], opts)
  await Template.removeTags('js-files', ['v1'], opts)
  out.tagsAfterRemove = (await Template.getTags(files.info.templateId, opts)).map((t) => t.tag)
  out.filesAgain = (await build(filesRecipe(), 'js-files')).executed

  // fromDockerfile: the JS parser passes `WORKDIR $APP` through; the builder expands it.
  const df = 'FROM busybox\nENV APP=/srv/js\nWORKDIR $APP\nRUN pwd > here && echo "$APP" >> here\n'
  await build(Template().fromDockerfile(df), 'js-dockerfile')

  // fromBaseImage (sudo for the default user), waitForFile, defaultBuildLogger.
  const base = Template()
    .fromBaseImage()
    .runCmd('sudo -n id -un > /home/user/sudo-as')
    .setStartCmd('sleep 1; touch /home/user/up', waitForFile('/home/user/up'))
  await Template.build(base, 'js-base', { ...opts, onBuildLogs: defaultBuildLogger() })

  // fromDebianImage, a ready command alone (waitForTimeout).
  const debian = Template()
    .fromDebianImage('bookworm')
    .runCmd('. /etc/os-release && echo $VERSION_CODENAME > /home/user/codename')
    .setReadyCmd(waitForTimeout(1000))
  out.debianLogs = (await build(debian, 'js-debian')).logs.filter((m) => m.startsWith('[finalize]'))

  // Template-level skipCache: everything runs again.
  const again = () => Template().skipCache().fromImage('busybox').runCmd('echo again > /home/user/again')
  await build(again(), 'js-again')
  out.againExecuted = (await build(again(), 'js-again')).executed

  // toJSON and toDockerfile describe what builds.
  const round = Template()
    .fromImage('busybox')
    .setEnvs({ ROUND: 'trip' })
    .setWorkdir('/srv/round')
    .runCmd('echo "$ROUND" > made')
    .setUser('root')
  out.toJSON = JSON.parse(await Template.toJSON(round))
  out.toDockerfile = Template.toDockerfile(round)
  await build(Template().fromDockerfile(out.toDockerfile), 'js-roundtrip')

  // buildInBackground and getBuildStatus: building from the start, then ready. The step
  // outlasts a held status request (ADR 0027: it may answer at the build's end), so the first
  // answer is the build in flight.
  const bg = await Template.buildInBackground(
    Template().fromImage('busybox').runCmd(`sleep 3; echo ${Date.now()} > /home/user/bg`),
    'js-background',
    opts,
  )
  out.statusRightAfterStart = (await Template.getBuildStatus(bg, opts)).status
  const deadline = Date.now() + 120_000
  let status
  do {
    await new Promise((r) => setTimeout(r, 300))
    status = (await Template.getBuildStatus(bg, { ...opts, logsOffset: 0 })).status
  } while (status === 'building' && Date.now() < deadline)
  out.statusAtEnd = status

  // Methods that need a team template of a given name, built here with tool stand-ins.
  await build(Template().fromImage('busybox').runCmd(recorder('mcp-gateway'), { user: 'root' }), 'mcp-gateway')
  await build(Template().fromTemplate('mcp-gateway').addMcpServer(['exa', 'brave']), 'js-mcp')
  const devTools =
    recorder('devcontainer') +
    " && printf '%s\\n' '#!/bin/sh' 'echo \"echo exec-into $1\"' > /prepare-exec.sh && chmod 755 /prepare-exec.sh"
  await build(Template().fromBaseImage().runCmd(devTools, { user: 'root' }), 'devcontainer')
  await build(
    Template()
      .fromTemplate('devcontainer')
      .betaDevContainerPrebuild('/home/user/proj')
      .betaSetDevContainerStart('/home/user/proj'),
    'js-dev',
  )

  // What needs a network fails at its step with the reason.
  out.alpineError = await failure(Template().fromAlpineImage('edge'), 'js-alpine')
  out.gitError = await failure(
    Template().fromImage('busybox').gitClone('https://example.invalid/r.git', '/tmp/r'),
    'js-git',
  )
} catch (err) {
  console.error(`${err.name}: ${err.message}`)
  console.error(JSON.stringify(out))
  process.exit(1)
}
console.log(JSON.stringify(out))
