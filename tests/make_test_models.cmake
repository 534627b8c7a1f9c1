# ctest fixture: makes the test models once per test run.
file(MAKE_DIRECTORY ${OUT})
foreach(kind text embedding)
  execute_process(COMMAND ${MAKER} --kind ${kind} --seed 42 -o ${OUT}/${kind}.gguf RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "making the ${kind} test model failed")
  endif()
endforeach()
