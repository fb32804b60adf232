// Reads templates and tags through the stock E2B JS SDK and its bundled API client, and checks
// every response against the SDK's own generated schema types (the `components` of
// node_modules/e2b/dist/index.d.ts): each required field present, each field of the declared
// kind. Usage: node templates_api.mjs NAME TEMPLATE_ID (E2B_API_KEY and E2B_API_URL set).
// Prints {tagsByName, tagsById, list, template} as JSON on the last line; exits non-zero with
// the list of violations otherwise.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { ApiClient, ConnectionConfig, Template } from 'e2b'

const [name, templateId] = process.argv.slice(2)
const opts = { apiKey: process.env.E2B_API_KEY, apiUrl: process.env.E2B_API_URL }

// The generated schema types: `    Name: {` ... `    };` blocks of `      field[?]: type;` lines,
// and one-line aliases such as `    CPUCount: number;`.
const dts = readFileSync(
  path.join(path.dirname(createRequire(import.meta.url).resolve('e2b')), 'index.d.ts'),
  'utf8',
)
const schemasText = dts.slice(dts.indexOf('  schemas: {'))
function schema(schemaName) {
  const lines = schemasText.split('\n')
  const start = lines.findIndex((l) => l === `    ${schemaName}: {`)
  if (start < 0) throw new Error(`no generated schema ${schemaName}`)
  const fields = []
  for (const line of lines.slice(start + 1)) {
    if (line === '    };') break
    const m = line.match(/^      (\w+)(\??): (.+);$/)
    if (m) fields.push({ field: m[1], required: m[2] === '', type: m[3] })
  }
  return fields
}
function alias(aliasName) {
  const m = schemasText.match(new RegExp(`\\n    ${aliasName}: ([^{\\n]+);\\n`))
  if (!m) throw new Error(`no generated alias ${aliasName}`)
  return m[1]
}

const problems = []
function check(value, type, where) {
  const options = type.split(' | ').map((t) => t.trim())
  if (value === null) {
    if (!options.includes('null')) problems.push(`${where}: null, declared ${type}`)
    return
  }
  for (const t of options.filter((o) => o !== 'null')) {
    const ref = t.match(/^components\["schemas"\]\["(\w+)"\](\[\])?$/)
    if (ref) {
      const isObject = schemasText.includes(`\n    ${ref[1]}: {\n`)
      const one = (v, w) => (isObject ? checkObject(v, ref[1], w) : check(v, alias(ref[1]), w))
      if (ref[2]) {
        if (!Array.isArray(value)) problems.push(`${where}: not an array`)
        else value.forEach((v, i) => one(v, `${where}[${i}]`))
      } else one(value, where)
      return
    }
    if (t === 'string' && typeof value === 'string') return
    if (t === 'number' && typeof value === 'number') return
    if (t === 'boolean' && typeof value === 'boolean') return
    if (t === 'string[]' && Array.isArray(value) && value.every((v) => typeof v === 'string')) return
    if (/^"/.test(t) && value === JSON.parse(t)) return
  }
  problems.push(`${where}: ${JSON.stringify(value)} is not ${type}`)
}
function checkObject(value, schemaName, where) {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    problems.push(`${where}: not a ${schemaName} object`)
    return
  }
  for (const { field, required, type } of schema(schemaName)) {
    if (!(field in value)) {
      if (required) problems.push(`${where}.${field}: required by ${schemaName}, missing`)
      continue
    }
    check(value[field], type, `${where}.${field}`)
  }
}

const client = new ApiClient(new ConnectionConfig(opts))
async function get(p, params) {
  const res = await client.api.GET(p, { params })
  if (res.error) throw new Error(`GET ${p}: ${res.response.status} ${JSON.stringify(res.error)}`)
  return res.data
}

const list = await get('/templates', {})
list.forEach((t, i) => checkObject(t, 'Template', `templates[${i}]`))
const one = await get('/templates/{templateID}', { path: { templateID: templateId } })
checkObject(one, 'TemplateWithBuilds', 'template')
const tagsRaw = await get('/templates/{templateID}/tags', { path: { templateID: name } })
tagsRaw.forEach((t, i) => checkObject(t, 'TemplateTag', `tags[${i}]`))

const tagsByName = await Template.getTags(name, opts)
const tagsById = await Template.getTags(templateId, opts)

if (problems.length) {
  console.error(problems.join('\n'))
  process.exit(1)
}
console.log(JSON.stringify({ tagsByName, tagsById, list, template: one }))
