//! A stream is a borrow of the context that owns it (the stream-ownership
//! spec: the runtime owns every stream), so it cannot outlive the context,
//! whether it comes from the inherent method or through `&dyn Runtime`.

use flex_rt::{FlexLibrary, Runtime, HardwareRuntime, Stream, StreamMode, StreamPriority};

fn main() {
    let library = FlexLibrary::open("libflex.so.1").unwrap();

    let stream;
    {
        let context = HardwareRuntime::create(library.clone(), 0).unwrap();
        stream = context.default_stream();
    }
    println!("{}", stream.id());

    let context = HardwareRuntime::create(library, 0).unwrap();
    let runtime: &dyn Runtime = &context;
    let created = runtime
        .create_stream(StreamPriority::High, StreamMode::StrictOrdering, false)
        .unwrap();
    drop(context);
    println!("{}", created.id());
}
