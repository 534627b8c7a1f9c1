# ctest fixture: makes the test models once per test run. A model whose bytes are those of the
# file already there is not written again, so its time stays that of its first making (the chaos
# suite's reference results are kept while the binaries and the model stay the same).
file(MAKE_DIRECTORY ${OUT})
foreach(kind text embedding)
  execute_process(COMMAND ${MAKER} --kind ${kind} --seed 42 -o ${OUT}/${kind}.gguf.new RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "making the ${kind} test model failed")
  endif()
  file(COPY_FILE ${OUT}/${kind}.gguf.new ${OUT}/${kind}.gguf ONLY_IF_DIFFERENT)
  file(REMOVE ${OUT}/${kind}.gguf.new)
endforeach()
