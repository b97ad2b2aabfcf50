use onnx_fuse::graph::{Graph, Scope};
use onnx_fuse::shapes::Shapes;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let loaded = onnx_fuse::io::load(std::path::Path::new(&args[1]), Default::default()).unwrap();
    let scope = Scope::default();
    let g = Graph::new(loaded.model.graph.as_ref().unwrap(), loaded.model.default_opset(), &scope);
    let s = Shapes::new(&g);
    for v in &args[2..] {
        println!("{v}: {:?}", s.shape(v));
        // Walk to the first unknown whose inputs are all known.
        let mut cur = v.clone();
        for _ in 0..60 {
            let Some(p) = g.producer(&cur) else {
                println!("  source {cur}");
                break;
            };
            let n = g.node(p);
            let unknown: Vec<&String> = n.input.iter().filter(|i| !i.is_empty() && s.shape(i).is_none()).collect();
            match unknown.first() {
                Some(u) => {
                    println!("  {} {} <- unknown {}", n.op_type(), n.name(), u);
                    cur = u.to_string();
                }
                None => {
                    println!(
                        "  STOP at {} {} (inputs known): {:?}",
                        n.op_type(),
                        n.name(),
                        n.input.iter().map(|i| s.shape(i).map(|x| x.len())).collect::<Vec<_>>()
                    );
                    break;
                }
            }
        }
    }
}
